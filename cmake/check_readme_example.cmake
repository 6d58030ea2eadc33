# Fails unless README.md quotes examples/custom_trainer.cpp verbatim (all but its first
# comment line), so the README's trainer example is always code that compiles and runs.
# Usage: cmake -DREADME=README.md -DEXAMPLE=examples/custom_trainer.cpp -P check_readme_example.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${example}" "\n" first_newline)
math(EXPR body_start "${first_newline} + 1")
string(SUBSTRING "${example}" ${body_start} -1 body)
string(STRIP "${body}" body)
string(FIND "${readme}" "${body}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "README.md does not quote ${EXAMPLE} verbatim: copy the file (without its first line) into the README's code block")
endif()
