// gtest_list() / gtest_run(name): the C++ contract tests, one case per call.
// Plain C++ (no Python headers): probe.cpp binds these for Python.
#include "gtest_runner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace pu1c {
namespace {

// GoogleTest, initialized once per process, printing nothing: results reach
// Python through Collector.
void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    static char arg0[] = "privateuse1_conformance";
    int argc = 1;
    char* argv[] = {arg0, nullptr};
    ::testing::InitGoogleTest(&argc, argv);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());
  });
}

std::string location(const ::testing::TestPartResult& part) {
  std::ostringstream out;
  std::string file = part.file_name() ? part.file_name() : "unknown file";
  // Sources are named from the kit's root, not the machine that built it.
  const auto kit = file.rfind("conformance/cxx/");
  if (kit != std::string::npos) file = file.substr(kit);
  out << file;
  if (part.line_number() >= 0) out << ":" << part.line_number();
  return out.str();
}

class Collector : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& part) override {
    if (part.skipped()) {
      skips.push_back(part.message());
    } else if (part.failed()) {
      failures.push_back(location(part) + ": " + part.message());
    }
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    ++ran;
    passed = info.result()->Passed();
    skipped = info.result()->Skipped();
  }

  std::vector<std::string> failures;
  std::vector<std::string> skips;
  int ran = 0;
  bool passed = false;
  bool skipped = false;
};

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (const auto& part : parts) {
    if (!text.empty()) text += "\n";
    text += part;
  }
  return text;
}

}  // namespace

std::vector<std::string> gtest_list() {
  ensure_initialized();
  std::vector<std::string> names;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit->total_test_suite_count(); ++i) {
    const auto* suite = unit->GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j) {
      names.push_back(std::string(suite->name()) + "." + suite->GetTestInfo(j)->name());
    }
  }
  return names;
}

GtestOutcome gtest_run(const std::string& name) {
  ensure_initialized();
  if (name.find_first_of("*?:-") != std::string::npos) {
    throw std::invalid_argument("gtest_run takes one case name (Suite.Name), not a filter: " + name);
  }
  GTEST_FLAG_SET(filter, name);
  GTEST_FLAG_SET(also_run_disabled_tests, false);
  GTEST_FLAG_SET(catch_exceptions, true);
  GTEST_FLAG_SET(break_on_failure, false);
  GTEST_FLAG_SET(throw_on_failure, false);
  GTEST_FLAG_SET(repeat, 1);
  GTEST_FLAG_SET(shuffle, false);

  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  auto* collector = new Collector;
  listeners.Append(collector);  // owned by GoogleTest until released
  // The outcome of the one case comes from the collector.
  [[maybe_unused]] const int status = RUN_ALL_TESTS();
  listeners.Release(collector);
  std::unique_ptr<Collector> owned(collector);

  if (owned->ran != 1) {
    std::string why = owned->ran == 0 ? "no C++ contract test is called " + name
                                      : "the name " + name + " selected several cases";
    if (owned->ran == 0 && (std::getenv("GTEST_TOTAL_SHARDS") || std::getenv("GTEST_SHARD_INDEX"))) {
      why += " (or GTEST_TOTAL_SHARDS/GTEST_SHARD_INDEX in the environment filtered it out)";
    }
    throw std::runtime_error(why);
  }
  if (owned->skipped) return {false, true, join(owned->skips)};
  return {owned->passed, false, join(owned->failures)};
}

}  // namespace pu1c
