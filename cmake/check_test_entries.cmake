# ctest entry: every doctest case of TESTS (the test executable) has exactly one ctest entry
# labelled "doctest" in BUILD_DIR, so no case is lost or split by test discovery.
#   cmake -DTESTS=<kiln_tests> -DCTEST=<ctest> -DBUILD_DIR=<dir> -P check_test_entries.cmake
execute_process(COMMAND ${TESTS} --count OUTPUT_VARIABLE count_output RESULT_VARIABLE count_status)
string(REGEX MATCH "passing the current filters: ([0-9]+)" count_line "${count_output}")
if(NOT count_status EQUAL 0 OR NOT count_line)
  message(FATAL_ERROR "cannot count the test cases of ${TESTS}:\n${count_output}")
endif()
set(cases ${CMAKE_MATCH_1})

execute_process(COMMAND ${CTEST} -N -L "^doctest$" WORKING_DIRECTORY ${BUILD_DIR}
                OUTPUT_VARIABLE list_output RESULT_VARIABLE list_status)
string(REGEX MATCH "Total Tests: ([0-9]+)" total_line "${list_output}")
if(NOT list_status EQUAL 0 OR NOT total_line)
  message(FATAL_ERROR "cannot list the ctest entries of ${BUILD_DIR}:\n${list_output}")
endif()
set(entries ${CMAKE_MATCH_1})

if(NOT cases EQUAL entries OR cases EQUAL 0)
  message(FATAL_ERROR "${cases} doctest cases but ${entries} ctest entries labelled doctest: a "
                      "test name with ';' or a discovery failure loses or splits cases")
endif()
message(STATUS "${cases} doctest cases, one ctest entry each")
