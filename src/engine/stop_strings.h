// Holds back generated text that might be the start of a stop string, so a
// stop string is never shown, not even in part, and text that turns out not
// to be one is released unchanged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace m40::engine {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);

  // Adds newly generated text. Returns the text that is now safe to show.
  // After a stop string is found, stopped() is true, the text before it has
  // been returned and everything from the stop string on is dropped.
  std::string push(std::string_view text);
  // End of generation: releases what was held back (no stop string came).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace m40::engine
