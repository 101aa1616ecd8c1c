// `m40-llm serve` as a child process on a free loopback port, for the client
// commands' tests: started with the port it announced, stopped (SIGTERM,
// then SIGKILL if it lingers) when the object goes.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "binary_runner.h"

namespace m40::test {

class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args) {
    err_path_ = std::filesystem::path(::testing::TempDir()) /
                ("m40_serve_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + ".err");
    std::vector<std::string> storage{binary_path(), "serve"};
    storage.insert(storage.end(), args.begin(), args.end());
    storage.insert(storage.end(), {"--host", "127.0.0.1", "--port", "0"});
    std::vector<char*> argv;
    for (auto& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, storage[0].c_str(), &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    // The port is in its first line on stderr; up to 10 s to appear.
    const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 1000 && pid_ > 0 && port_ == 0; ++i) {
      std::smatch m;
      const std::string err = read_text_file(err_path_);
      if (std::regex_search(err, m, listening)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 500; ++i) {
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
    }
    std::filesystem::remove(err_path_);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }  // 0 when it never announced one
  std::string log() const { return read_text_file(err_path_); }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  pid_t pid_ = -1;
  int port_ = 0;
  std::filesystem::path err_path_;
};

}  // namespace m40::test
