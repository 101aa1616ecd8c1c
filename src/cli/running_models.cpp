#include "cli/running_models.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include "common/error.h"
#include "store/store.h"

namespace m40::cli {

namespace {

// Ollama's humanDuration: the coarse wording people read at a glance.
std::string human_duration(int64_t seconds) {
  const auto count = [](int64_t n, const char* unit) { return std::to_string(n) + " " + unit + (n == 1 ? "" : "s"); };
  if (seconds < 1) return "Less than a second";
  if (seconds < 60) return count(seconds, "second");
  if (seconds < 120) return "About a minute";
  if (seconds < 3600) return count(seconds / 60, "minute");
  if (seconds < 7200) return "About an hour";
  if (seconds < 48 * 3600) return count(seconds / 3600, "hour");
  if (seconds < 7 * 86400) return count(seconds / 86400, "day");
  if (seconds < 30 * 86400) return count(seconds / (7 * 86400), "week");
  if (seconds < 365 * 86400) return count(seconds / (30 * 86400), "month");
  return count(seconds / (365 * 86400), "year");
}

uint64_t get_size(const nlohmann::json& entry, const char* key) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_number()) return 0;
  return it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(std::max(0.0, it->get<double>()));
}

std::string get_text(const nlohmann::json& entry, const char* key) {
  const auto it = entry.find(key);
  return it != entry.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

std::string processor_text(uint64_t size, uint64_t size_vram) {
  if (size_vram == 0) return "100% CPU";
  if (size_vram >= size) return "100% GPU";
  const int gpu = static_cast<int>(std::lround(100.0 * static_cast<double>(size_vram) / static_cast<double>(size)));
  return std::to_string(100 - gpu) + "%/" + std::to_string(gpu) + "% CPU/GPU";
}

std::optional<int64_t> parse_rfc3339(const std::string& text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute, &second,
                  &consumed) != 6) {
    return std::nullopt;
  }
  size_t i = static_cast<size_t>(consumed);
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  }
  int64_t offset = 0;
  if (i < text.size() && (text[i] == 'Z' || text[i] == 'z')) {
    ++i;
  } else if (i < text.size() && (text[i] == '+' || text[i] == '-')) {
    int oh = 0, om = 0;
    if (std::sscanf(text.c_str() + i + 1, "%2d:%2d", &oh, &om) != 2) return std::nullopt;
    offset = (text[i] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  return static_cast<int64_t>(timegm(&tm)) - offset;
}

std::string until_text(const std::string& expires_at, int64_t now) {
  const auto at = parse_rfc3339(expires_at);
  if (!at) return "Never";
  const int64_t left = *at - now;
  if (left > int64_t{20} * 365 * 86400) return "Forever";  // kept loaded for good (keep_alive < 0)
  if (left < 0) return "Stopping...";
  return human_duration(left) + " from now";
}

std::vector<std::vector<std::string>> running_models_table(const nlohmann::json& ps, int64_t now) {
  if (!ps.is_object() || !ps.contains("models") || !ps["models"].is_array()) {
    throw Error("the server's /api/ps answer has no \"models\" list: is it an m40-llm or Ollama server?");
  }
  std::vector<std::vector<std::string>> rows{{"NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"}};
  // m40-llm servers say which backend holds each model; Ollama's do not,
  // and their table stays as Ollama prints it.
  bool any_device = false;
  for (const auto& entry : ps["models"]) any_device |= entry.is_object() && !get_text(entry, "device").empty();
  if (any_device) rows[0].push_back("DEVICE");
  for (const auto& entry : ps["models"]) {
    if (!entry.is_object()) continue;
    std::string name = get_text(entry, "name");
    if (name.empty()) name = get_text(entry, "model");
    std::string digest = get_text(entry, "digest");
    if (digest.starts_with("sha256:")) digest.erase(0, 7);
    const uint64_t size = get_size(entry, "size");
    rows.push_back({name, digest.empty() ? "-" : digest.substr(0, 12), store::human_size(size),
                    processor_text(size, get_size(entry, "size_vram")), until_text(get_text(entry, "expires_at"), now)});
    if (any_device) {
      const std::string device = get_text(entry, "device");
      rows.back().push_back(device.empty() ? "-" : device);
    }
  }
  return rows;
}

}  // namespace m40::cli
