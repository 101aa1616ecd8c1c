// A pull run as its own process in the background, so that a test can
// interrupt it, kill it, or do something else while it runs.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "binary_runner.h"

namespace m40::test {

// m40-llm ARGS, started now; wait() collects its exit status and output.
class BackgroundPull {
 public:
  // `as_user`: when >= 0, the child drops to this uid/gid before exec
  // (a root test run checking what a user without write access sees).
  explicit BackgroundPull(const std::vector<std::string>& args, int as_user = -1) {
    const std::filesystem::path dir = ::testing::TempDir();
    const std::string stem = "m40_pull_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++);
    out_ = dir / (stem + ".out");
    err_ = dir / (stem + ".err");
    std::vector<std::string> storage{binary_path()};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int out_fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    const int err_fd = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out_fd, 1);
      ::dup2(err_fd, 2);
      const int null_fd = ::open("/dev/null", O_RDONLY);
      ::dup2(null_fd, 0);
      if (as_user >= 0 && (::setgroups(0, nullptr), ::setgid(as_user) != 0 || ::setuid(as_user) != 0)) ::_exit(125);
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(out_fd);
    ::close(err_fd);
  }
  ~BackgroundPull() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    std::error_code ec;
    std::filesystem::remove(out_, ec);
    std::filesystem::remove(err_, ec);
  }
  BackgroundPull(const BackgroundPull&) = delete;
  BackgroundPull& operator=(const BackgroundPull&) = delete;

  void signal(int sig) const { ::kill(pid_, sig); }
  BinaryResult wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    waited_ = true;
    BinaryResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_text_file(out_);
    r.err = read_text_file(err_);
    return r;
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  bool waited_ = false;
  std::filesystem::path out_, err_;
};

// Waits (bounded, not timed) until `path` holds `bytes` bytes.
inline bool wait_for_size(const std::filesystem::path& path, uint64_t bytes) {
  for (int i = 0; i < 6000; ++i) {
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) == bytes && !ec) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Stops a pull of `args` once `partial` holds `bytes` bytes (Ctrl-C).
inline void interrupt_pull_at(const std::vector<std::string>& args, const std::filesystem::path& partial, uint64_t bytes) {
  BackgroundPull pull(args);
  ASSERT_TRUE(wait_for_size(partial, bytes)) << "the pull never got there";
  pull.signal(SIGINT);
  const BinaryResult r = pull.wait();
  ASSERT_EQ(r.exit_code, 130) << r.err;
}

}  // namespace m40::test
