// The test runner: doctest's main, failing any run whose filters select no test case, so a
// ctest entry cannot pass without running the case it names, and ending a run in which a case
// skipped (and none failed) with the code ctest reports as a skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "support/skip.hpp"

namespace {

unsigned selected_cases = 0;
bool any_skipped = false;

/// Listens for the end of the run to learn how many test cases passed the filters.
struct SelectionCounter final : doctest::IReporter {
  explicit SelectionCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    selected_cases = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

} // namespace

void kiln::test::skip(const std::string& reason) {
  any_skipped = true;
  MESSAGE("skipped: " << reason);
}

REGISTER_LISTENER("selection_counter", 1, SelectionCounter);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result; // --help, --list-test-cases and other queries
  if (selected_cases == 0) {
    std::fputs("kiln_tests: no test case matches the filters given; a test name with ';' or a "
               "filter with a typo selects nothing\n",
               stderr);
    return 1;
  }
  return result == 0 && any_skipped ? kiln::test::skip_exit_code : result;
}
