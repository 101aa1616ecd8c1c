#include <cstdio>
#include <exception>
#include <functional>

#include "cli/commands.h"
#include "common/error.h"

namespace m40::cli {

namespace {
std::function<int()>& selected_action() {
  static std::function<int()> action;
  return action;
}
}  // namespace

void set_command_action(std::function<int()> action) { selected_action() = std::move(action); }

int run_selected_command() {
  auto& action = selected_action();
  if (!action) return 1;
  try {
    return action();
  } catch (const m40::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace m40::cli
