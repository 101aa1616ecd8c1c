// A fresh $M40_LLM_HOME per test, set in the environment (so that the
// library and spawned m40-llm binaries both use it) and removed afterwards.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace m40::test {

class TempStoreHome {
 public:
  TempStoreHome() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("m40_store_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
    ::setenv("M40_LLM_HOME", path_.c_str(), 1);
  }
  ~TempStoreHome() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    ::unsetenv("M40_LLM_HOME");
  }
  TempStoreHome(const TempStoreHome&) = delete;
  TempStoreHome& operator=(const TempStoreHome&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace m40::test
