// The m40-llm binary under a pseudo-terminal (forkpty), for the interactive
// commands: what a user types goes in, what the terminal would show comes
// out. Every wait has a limit; the child is killed when the test is done.
#pragma once

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "test_paths.h"

namespace m40::test {

class PtySession {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kDefaultWait{60000};

  // Runs `m40-llm ARGS...` with extra environment variables (NAME, VALUE).
  PtySession(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env) {
    std::vector<std::string> storage{binary_path()};
    storage.insert(storage.end(), args.begin(), args.end());
    winsize size{};
    size.ws_row = 50;
    size.ws_col = 1000;  // wide enough that no line the tests type wraps
    pid_ = forkpty(&master_, nullptr, nullptr, &size);
    if (pid_ == 0) {
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv;
      for (auto& s : storage) argv.push_back(s.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~PtySession() {
    if (pid_ > 0 && exit_code_ < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) ::close(master_);
  }
  PtySession(const PtySession&) = delete;
  PtySession& operator=(const PtySession&) = delete;

  bool started() const { return pid_ > 0 && master_ >= 0; }

  // Types `text` (use "\r" for Enter, "\x03" for Ctrl-C, "\x04" for Ctrl-D).
  void type(const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(master_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  // Waits until the program edits a line (libedit switches the terminal
  // out of canonical mode) or, with `editing` false, until it does not.
  // Typing before a line editor reads would be echoed twice: once by the
  // terminal, once by the editor. Master and slave share one termios.
  bool wait_until_editing(bool editing = true, std::chrono::milliseconds limit = kDefaultWait) {
    const auto until = Clock::now() + limit;
    for (;;) {
      termios t{};
      if (::tcgetattr(master_, &t) == 0 && ((t.c_lflag & ICANON) == 0) == editing) return true;
      if (Clock::now() >= until) return false;
      read_some(std::min(until, Clock::now() + std::chrono::milliseconds(5)));
    }
  }

  // Everything shown so far, carriage returns removed.
  const std::string& output() const { return output_; }
  size_t mark() const { return output_.size(); }

  // Reads until `text` appears at or after `from`; returns where it starts,
  // or npos when the limit passed or the terminal closed first.
  size_t wait_for(const std::string& text, size_t from, std::chrono::milliseconds limit = kDefaultWait) {
    const auto until = Clock::now() + limit;
    for (;;) {
      const size_t at = output_.find(text, std::min(from, output_.size()));
      if (at != std::string::npos) return at;
      if (!read_some(until)) return std::string::npos;
    }
  }

  // Waits for the child to exit; its status, or -1 when it had to be killed.
  int wait_exit(std::chrono::milliseconds limit = kDefaultWait) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      read_some(std::min(until, Clock::now() + std::chrono::milliseconds(20)));
    }
    return -1;
  }

 private:
  // Appends what arrives before `until`; false when nothing will come.
  bool read_some(Clock::time_point until) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{master_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) return true;
    char buf[4096];
    const ssize_t n = ::read(master_, buf, sizeof buf);
    if (n <= 0) return false;  // EIO: the child closed the terminal
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\r') output_ += buf[i];
    }
    return true;
  }

  pid_t pid_ = -1;
  int master_ = -1;
  int exit_code_ = -1;
  std::string output_;
};

}  // namespace m40::test
