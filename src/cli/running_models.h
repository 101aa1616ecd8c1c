// What `m40-llm ps` shows of a server's /api/ps answer (Ollama's shape:
// {"models": [{name, size, digest, size_vram, expires_at, ...}]}), as the
// rows of its table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace m40::cli {

// "100% GPU", "100% CPU", or the split "48%/52% CPU/GPU" as Ollama prints it.
std::string processor_text(uint64_t size, uint64_t size_vram);

// Seconds since the epoch of an RFC 3339 time ("2024-06-04T14:38:31.83753-07:00",
// "9999-12-31T23:59:59Z"); nullopt when it is not one.
std::optional<int64_t> parse_rfc3339(const std::string& text);

// When a model will be unloaded, relative to `now`: "4 minutes from now",
// "Forever" (decades away), "Stopping..." (past), "Never" (no time given).
std::string until_text(const std::string& expires_at, int64_t now);

// The table: a header (NAME, ID, SIZE, PROCESSOR, UNTIL) and one row per
// model. Throws m40::Error when the answer is not /api/ps's shape.
std::vector<std::vector<std::string>> running_models_table(const nlohmann::json& ps, int64_t now);

}  // namespace m40::cli
