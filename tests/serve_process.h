// `m40-llm serve` as a child process on a free loopback port (for the server
// and client-command tests): started with
// arguments, its port read from the first line it prints, stopped with
// SIGTERM (killed when it does not stop in time).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "binary_runner.h"

namespace m40::test {

class ServeProcess {
 public:
  // Starts `m40-llm serve ARGS... --port 0` and waits (bounded) for its port.
  explicit ServeProcess(std::vector<std::string> args) {
    err_path_ = std::filesystem::path(::testing::TempDir()) /
                ("m40_serve_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + ".err");
    std::vector<std::string> storage{binary_path(), "serve"};
    storage.insert(storage.end(), args.begin(), args.end());
    storage.insert(storage.end(), {"--port", "0"});
    std::vector<char*> argv;
    for (auto& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pid_, storage[0].c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = 0;
      return;
    }
    const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
    const std::regex ready("m40-llm: ready");
    for (int i = 0; i < 3000; ++i) {  // up to 30 s: a model loads first
      std::smatch m;
      const std::string err = stderr_text();
      if (port_ == 0 && std::regex_search(err, m, listening)) port_ = std::stoi(m[1]);
      if (port_ != 0 && std::regex_search(err, ready)) return;
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ServeProcess() {
    stop();
    std::error_code ec;
    std::filesystem::remove(err_path_, ec);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  bool running() const { return pid_ > 0 && port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string stderr_text() const { return read_text_file(err_path_); }

  // SIGTERM, then the exit status (-1: it had to be killed).
  int stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 1500; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
    return -1;
  }

  // The process's resident memory in KiB (VmRSS of /proc/PID/status).
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path err_path_;
  pid_t pid_ = 0;
  int port_ = 0;
};

}  // namespace m40::test
