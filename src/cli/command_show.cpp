// `m40-llm show FILE`: what a GGUF file holds, as a sectioned report (Model,
// Architecture, Tokenizer, Tensors by type) like `ollama show` and llama.cpp's
// load log, or as one JSON document for scripts. --tensors and --metadata add
// the full tensor list and every metadata key.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <variant>

#include "cli/commands.h"
#include "gguf/file.h"
#include "model/architecture.h"
#include "model/hparams.h"
#include "model/model_summary.h"
#include "store/model_ref.h"

namespace m40::cli {

namespace {

struct ShowOptions {
  std::string path;
  bool tensors = false;
  bool metadata = false;
  bool json = false;
};

using Json = nlohmann::ordered_json;

// Long arrays (vocabularies, merges, scores) are cut to this many items in
// --metadata output, text and JSON alike; their length is always given.
constexpr size_t kTextArrayItems = 8;
constexpr size_t kJsonArrayItems = 16;
constexpr size_t kTextStringBytes = 80;

std::string group_digits(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string shape_string(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string file_type_text(uint32_t id) {
  auto name = model::file_type_name(id);
  return (name ? *name : std::string("unknown")) + " (" + std::to_string(id) + ")";
}

// ---------------------------------------------------------------- text

// Sections of "label   value" rows; a section without rows is not printed.
class Report {
 public:
  void section(const std::string& title) { pending_title_ = title; }
  void row(const std::string& label, const std::string& value) {
    std::string text = label;
    text.append(label.size() < kLabelWidth ? kLabelWidth - label.size() : 1, ' ');
    line(text + value);
  }
  void line(const std::string& text) {
    if (!pending_title_.empty()) {
      if (!out_.empty()) out_ += '\n';
      out_ += "  " + pending_title_ + "\n";
      pending_title_.clear();
    }
    out_ += "    " + text + "\n";
  }
  const std::string& text() const { return out_; }

 private:
  static constexpr size_t kLabelWidth = 22;
  std::string out_;
  std::string pending_title_;
};

// "12 tensors not read (vision tower: v.*, mm.*)": what a runnable file
// holds beyond what the forward pass reads, by kind.
std::string unused_tensors_text(const std::vector<std::string>& names) {
  size_t vision = 0;
  std::vector<std::string> others;
  for (const auto& n : names) {
    if (n.starts_with("v.") || n.starts_with("mm.") || n.starts_with("vision")) {
      ++vision;
    } else {
      others.push_back(n);
    }
  }
  std::string text = std::to_string(names.size()) + (names.size() == 1 ? " tensor" : " tensors") + " not read (";
  if (vision > 0) text += "vision tower tensors are ignored: " + std::to_string(vision);
  for (size_t i = 0; i < others.size() && i < 3; ++i) text += (i > 0 || vision > 0 ? ", " : "") + others[i];
  if (others.size() > 3) text += ", ...";
  return text + ")";
}

std::string runnable_text(const model::ModelSummary& s) {
  if (!s.architecture_runnable) return "no: " + s.not_runnable_reason;
  std::string text = "yes";
  if (!s.unused_tensors.empty()) text += "; " + unused_tensors_text(s.unused_tensors);
  return text;
}

void model_section(Report& r, const model::ModelSummary& s) {
  r.section("Model");
  if (!s.architecture.empty()) {
    std::string arch = s.architecture;
    if (!s.architecture_known) arch += " (not supported by m40-llm)";
    r.row("architecture", arch);
  }
  r.row("runnable", runnable_text(s));
  if (s.name) r.row("name", *s.name);
  if (s.size_label) r.row("size label", *s.size_label);
  if (s.tensor_count > 0) {
    r.row("parameters", model::format_parameter_count(s.parameter_count) + " (" + group_digits(s.parameter_count) + ")");
  }
  if (s.file_type) r.row("file type", file_type_text(*s.file_type));
  r.row("file size", model::format_bytes(s.file_size) + " (" + group_digits(s.file_size) + " bytes)");
  if (auto bpw = s.bits_per_weight()) r.row("bits per weight", fixed(*bpw, 2));
  if (s.license) r.row("license", *s.license);
  r.row("format", "GGUF v" + std::to_string(s.gguf_version) + ", " + std::to_string(s.metadata_count) +
                      " metadata keys, " + std::to_string(s.tensor_count) + " tensors");
}

// An embedding model's pooling by name ("last"), with its number when it is
// none llama.cpp defines.
std::string pooling_text(uint64_t pooling) {
  if (pooling <= static_cast<uint64_t>(model::PoolingType::Rank)) {
    return std::string(model::pooling_type_name(static_cast<model::PoolingType>(pooling)));
  }
  return "unknown (" + std::to_string(pooling) + ")";
}

void architecture_section(Report& rows, const model::ModelSummary& s) {
  rows.section("Architecture");
  const auto number = [&](const char* label, const std::optional<uint64_t>& v) {
    if (v) rows.row(label, std::to_string(*v));
  };
  number("context length", s.context_length);
  number("embedding length", s.embedding_length);
  number("layers", s.block_count);
  number("attention heads", s.head_count);
  if (s.head_count_kv) {
    std::string kv = std::to_string(*s.head_count_kv);
    if (s.head_count && *s.head_count_kv > 0 && *s.head_count_kv < *s.head_count &&
        *s.head_count % *s.head_count_kv == 0) {
      kv += " (GQA, " + std::to_string(*s.head_count / *s.head_count_kv) + " query heads per KV head)";
    }
    rows.row("KV heads", kv);
  }
  number("head dim", s.head_dim);
  number("feed-forward length", s.feed_forward_length);
  if (s.has_experts()) {
    std::string experts = std::to_string(*s.expert_count);
    if (s.expert_used_count) experts += ", " + std::to_string(*s.expert_used_count) + " used per token";
    if (s.expert_feed_forward_length) experts += ", expert FFN width " + std::to_string(*s.expert_feed_forward_length);
    if (s.shared_expert_feed_forward_length) {
      experts += ", a shared expert of width " + std::to_string(*s.shared_expert_feed_forward_length);
    }
    rows.row("experts", experts);
    if (s.active_parameter_count) {
      rows.row("active parameters", model::format_parameter_count(*s.active_parameter_count) + " per token");
    }
  }
  if (s.decode_bytes_per_token) {
    // A Tesla M40 moves 288 GB/s: a decode step can go no faster than that
    // over the weights it reads.
    char ceiling[96];
    std::snprintf(ceiling, sizeof ceiling, " (at most %.0f tokens/s on a Tesla M40's 288 GB/s)",
                  288e9 / static_cast<double>(std::max<uint64_t>(*s.decode_bytes_per_token, 1)));
    rows.row("decode reads", model::format_bytes(*s.decode_bytes_per_token) + " of weights per token" + ceiling);
  }
  if (s.rope_dimension_count || s.rope_freq_base || s.rope_scaling_type || s.rope_scaling_factor) {
    std::string rope;
    const auto add = [&](const std::string& part) { rope += (rope.empty() ? "" : ", ") + part; };
    if (s.rope_dimension_count) add(std::to_string(*s.rope_dimension_count) + " dims");
    if (s.rope_freq_base) add("freq base " + model::format_float(*s.rope_freq_base));
    if (s.rope_scaling_type || s.rope_scaling_factor) {
      std::string scaling = "scaling " + s.rope_scaling_type.value_or("linear");
      if (s.rope_scaling_factor) scaling += " x" + model::format_float(*s.rope_scaling_factor);
      if (s.rope_scaling_original_context_length) {
        scaling += " (original context " + std::to_string(*s.rope_scaling_original_context_length) + ")";
      }
      add(scaling);
    }
    rows.row("RoPE", rope);
  }
  if (s.rms_norm_eps) rows.row("RMS norm epsilon", model::format_float(*s.rms_norm_eps));
  if (s.layer_norm_eps) rows.row("layer norm epsilon", model::format_float(*s.layer_norm_eps));
  number("vocabulary size", s.vocab_size);
  if (s.output_tied) rows.row("output", *s.output_tied ? "tied to token_embd.weight" : "output.weight");
  if (s.pooling_type) rows.row("pooling", pooling_text(*s.pooling_type) + " (an embedding model)");
}

void tokenizer_section(Report& r, const model::ModelSummary& s) {
  r.section("Tokenizer");
  if (s.tokenizer_model) {
    std::string model = *s.tokenizer_model;
    if (auto kind = model::tokenizer_kind(model); !kind.empty()) model += " (" + std::string(kind) + ")";
    r.row("model", model);
  }
  if (s.tokenizer_pre) r.row("pre-tokenizer", *s.tokenizer_pre);
  if (s.token_count) r.row("tokens", std::to_string(*s.token_count));
  if (s.merge_count) r.row("merges", std::to_string(*s.merge_count));
  for (const auto& t : s.special_tokens) {
    std::string value = std::to_string(t.id);
    if (t.text) value += " '" + model::escape_for_display(*t.text, 60) + "'";
    else if (s.token_count) value += " (outside the vocabulary)";
    r.row(std::string(t.label) + " token", value);
  }
  if (s.add_bos) r.row("add BOS", *s.add_bos ? "yes" : "no");
  if (s.add_eos) r.row("add EOS", *s.add_eos ? "yes" : "no");
  if (s.tokenizer_model || s.token_count) {
    r.row("chat template", s.has_chat_template ? "yes (" + group_digits(s.chat_template_bytes) + " bytes)" : "no");
  }
}

void tensor_types_section(Report& r, const model::ModelSummary& s) {
  r.section("Tensors by type");
  if (s.tensor_types.empty()) {
    r.line("none (a vocabulary-only file)");
    return;
  }
  for (const auto& t : s.tensor_types) {
    char buf[160];
    const double bpw = t.elements == 0 ? 0.0 : static_cast<double>(t.bytes) * 8.0 / static_cast<double>(t.elements);
    std::snprintf(buf, sizeof buf, "%-8s %4zu %-7s  %14s weights  %12s  %6.2f bpw",
                  std::string(gguf::tensor_type_name(t.type)).c_str(), t.count, t.count == 1 ? "tensor" : "tensors",
                  group_digits(t.elements).c_str(),
                  model::format_bytes(t.bytes).c_str(), bpw);
    r.line(buf);
  }
}

void tensors_section(Report& r, const gguf::File& file) {
  r.section("Tensors (" + std::to_string(file.tensors().size()) + "; offsets are from the data section at byte " +
            group_digits(file.data_offset()) + ")");
  if (file.tensors().empty()) {
    r.line("none");
    return;
  }
  size_t name_width = 4;
  size_t shape_width = 5;
  for (const auto& t : file.tensors()) {
    name_width = std::max(name_width, t.name.size());
    shape_width = std::max(shape_width, shape_string(t.dims).size());
  }
  const auto pad = [](std::string s, size_t width) {
    if (s.size() < width) s.append(width - s.size(), ' ');
    return s;
  };
  const auto lpad = [](std::string s, size_t width) {
    if (s.size() < width) s.insert(0, width - s.size(), ' ');
    return s;
  };
  const size_t index_width = std::to_string(file.tensors().size()).size();
  r.line(lpad("#", index_width) + "  " + pad("name", name_width) + "  " + pad("type", 7) + "  " +
         pad("shape", shape_width) + "  " + lpad("bytes", 13) + "  " + lpad("offset", 13));
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const auto& t = file.tensors()[i];
    r.line(lpad(std::to_string(i), index_width) + "  " + pad(t.name, name_width) + "  " +
           pad(std::string(gguf::tensor_type_name(t.type)), 7) + "  " + pad(shape_string(t.dims), shape_width) +
           "  " + lpad(group_digits(t.byte_size), 13) + "  " + lpad(group_digits(t.offset), 13));
  }
}

std::string value_type_text(const gguf::Value& v) {
  if (const auto* a = std::get_if<gguf::Array>(&v.storage)) {
    return "[" + std::string(gguf::value_type_name(a->element_type)) + "]";
  }
  return std::string(gguf::value_type_name(v.type()));
}

void metadata_section(Report& r, const gguf::Metadata& md) {
  r.section("Metadata (" + std::to_string(md.size()) + " keys)");
  size_t key_width = 0;
  size_t type_width = 0;
  for (const auto& [key, value] : md.entries()) {
    key_width = std::max(key_width, key.size());
    type_width = std::max(type_width, value_type_text(value).size());
  }
  for (const auto& [key, value] : md.entries()) {
    std::string line = key;
    line.append(key_width - key.size() + 2, ' ');
    const std::string type = value_type_text(value);
    line += type;
    line.append(type_width - type.size() + 2, ' ');
    line += model::format_metadata_value(value, kTextArrayItems, kTextStringBytes);
    r.line(line);
  }
}

// ---------------------------------------------------------------- JSON

Json json_value(const gguf::Value& value) {
  return std::visit(
      [&](const auto& v) -> Json {
        using S = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<S, gguf::Array>) {
          Json items = Json::array();
          for (size_t i = 0; i < v.items.size() && i < kJsonArrayItems; ++i) {
            items.push_back(json_value(v.items[i]));
          }
          return items;
        } else if constexpr (std::is_floating_point_v<S>) {
          return *model::metadata_float(value);
        } else {
          return v;
        }
      },
      value.storage);
}

Json metadata_json(const gguf::Metadata& md) {
  Json out = Json::object();
  for (const auto& [key, value] : md.entries()) {
    Json entry = Json::object();
    if (const auto* a = std::get_if<gguf::Array>(&value.storage)) {
      entry["type"] = "array";
      entry["element_type"] = gguf::value_type_name(a->element_type);
      entry["length"] = a->items.size();
      entry["truncated"] = a->items.size() > kJsonArrayItems;
    } else {
      entry["type"] = gguf::value_type_name(value.type());
    }
    entry["value"] = json_value(value);
    out[key] = std::move(entry);
  }
  return out;
}

template <class T> void put(Json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

Json summary_json(const model::ModelSummary& s) {
  Json j = Json::object();
  j["path"] = s.path;
  j["file_size"] = s.file_size;
  j["gguf_version"] = s.gguf_version;
  j["alignment"] = s.alignment;
  j["data_offset"] = s.data_offset;
  j["metadata_count"] = s.metadata_count;
  j["tensor_count"] = s.tensor_count;

  Json m = Json::object();
  if (!s.architecture.empty()) m["architecture"] = s.architecture;
  m["architecture_known"] = s.architecture_known;
  m["runnable"] = s.architecture_runnable;
  if (!s.architecture_runnable) m["not_runnable_reason"] = s.not_runnable_reason;
  if (!s.unused_tensors.empty()) m["unused_tensors"] = s.unused_tensors;
  put(m, "name", s.name);
  put(m, "size_label", s.size_label);
  put(m, "license", s.license);
  m["parameter_count"] = s.parameter_count;
  m["parameters"] = model::format_parameter_count(s.parameter_count);
  if (s.file_type) {
    Json ft = Json::object();
    ft["id"] = *s.file_type;
    if (auto name = model::file_type_name(*s.file_type)) ft["name"] = *name;
    m["file_type"] = std::move(ft);
  }
  put(m, "quantization_version", s.quantization_version);
  m["tensor_bytes"] = s.tensor_bytes;
  put(m, "bits_per_weight", s.bits_per_weight());
  j["model"] = std::move(m);

  Json a = Json::object();
  put(a, "context_length", s.context_length);
  put(a, "embedding_length", s.embedding_length);
  put(a, "block_count", s.block_count);
  put(a, "feed_forward_length", s.feed_forward_length);
  put(a, "expert_count", s.expert_count);
  put(a, "expert_used_count", s.expert_used_count);
  put(a, "expert_feed_forward_length", s.expert_feed_forward_length);
  put(a, "shared_expert_feed_forward_length", s.shared_expert_feed_forward_length);
  put(a, "active_parameter_count", s.active_parameter_count);
  put(a, "decode_bytes_per_token", s.decode_bytes_per_token);
  put(a, "head_count", s.head_count);
  put(a, "head_count_kv", s.head_count_kv);
  put(a, "head_dim", s.head_dim);
  put(a, "rope_dimension_count", s.rope_dimension_count);
  put(a, "rope_freq_base", s.rope_freq_base);
  put(a, "rope_scaling_type", s.rope_scaling_type);
  put(a, "rope_scaling_factor", s.rope_scaling_factor);
  put(a, "rope_scaling_original_context_length", s.rope_scaling_original_context_length);
  put(a, "rms_norm_eps", s.rms_norm_eps);
  put(a, "layer_norm_eps", s.layer_norm_eps);
  put(a, "vocab_size", s.vocab_size);
  put(a, "output_tied", s.output_tied);
  if (s.pooling_type) a["pooling_type"] = pooling_text(*s.pooling_type);
  a["embedding_model"] = s.embedding_model();
  j["architecture"] = std::move(a);

  Json t = Json::object();
  put(t, "model", s.tokenizer_model);
  put(t, "pre", s.tokenizer_pre);
  put(t, "token_count", s.token_count);
  put(t, "merge_count", s.merge_count);
  Json special = Json::object();
  for (const auto& tok : s.special_tokens) {
    std::string label(tok.label);
    std::transform(label.begin(), label.end(), label.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    Json entry = Json::object();
    entry["id"] = tok.id;
    put(entry, "text", tok.text);
    special[label] = std::move(entry);
  }
  t["special_tokens"] = std::move(special);
  put(t, "add_bos", s.add_bos);
  put(t, "add_eos", s.add_eos);
  t["chat_template"] = s.has_chat_template;
  if (s.has_chat_template) t["chat_template_bytes"] = s.chat_template_bytes;
  j["tokenizer"] = std::move(t);

  Json types = Json::array();
  for (const auto& tt : s.tensor_types) {
    types.push_back(Json{{"type", gguf::tensor_type_name(tt.type)},
                         {"count", tt.count},
                         {"elements", tt.elements},
                         {"bytes", tt.bytes}});
  }
  j["tensor_types"] = std::move(types);
  return j;
}

Json tensors_json(const gguf::File& file) {
  Json out = Json::array();
  for (const auto& t : file.tensors()) {
    out.push_back(Json{{"name", t.name},
                       {"type", gguf::tensor_type_name(t.type)},
                       {"shape", t.dims},
                       {"elements", t.element_count},
                       {"bytes", t.byte_size},
                       {"offset", t.offset},
                       {"file_offset", file.data_offset() + t.offset}});
  }
  return out;
}

int run_show(const ShowOptions& opts) {
  const gguf::File file = gguf::File::open(store::resolve_model(opts.path));
  const model::ModelSummary summary = model::summarize(file);

  if (opts.json) {
    Json j = summary_json(summary);
    if (opts.tensors) j["tensors"] = tensors_json(file);
    if (opts.metadata) j["metadata"] = metadata_json(file.metadata());
    // Token texts need not be valid UTF-8; replace bad bytes rather than fail.
    std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
    return 0;
  }

  Report r;
  model_section(r, summary);
  architecture_section(r, summary);
  tokenizer_section(r, summary);
  tensor_types_section(r, summary);
  if (opts.tensors) tensors_section(r, file);
  if (opts.metadata) metadata_section(r, file.metadata());
  std::cout << r.text();
  return 0;
}

// The architectures m40-llm runs, and those it knows but does not run yet.
std::string architectures_text() {
  std::string runs, later;
  for (const auto& a : model::known_architectures()) {
    if (a.runnable()) {
      runs += (runs.empty() ? "" : ", ") + std::string(a.name);
    } else {
      later += "  " + std::string(a.name) + ": " + std::string(a.not_runnable) + "\n";
    }
  }
  std::string text = "Architectures m40-llm runs: " + runs + ".\n";
  if (!later.empty()) text += "Known, not run yet:\n" + later;
  return text;
}

}  // namespace

void register_show_command(CLI::App& app) {
  auto opts = std::make_shared<ShowOptions>();
  CLI::App* cmd = app.add_subcommand(
      "show",
      "Describe a GGUF model file: architecture, size, hyperparameters, tokenizer and tensor types.\n"
      "Works on any GGUF file, including vocabulary-only files and architectures m40-llm cannot run;\n"
      "`runnable` says whether m40-llm can run it, or why not.");
  cmd->add_option("MODEL", opts->path, "A store name (see `m40-llm list`) or a GGUF file")->required();
  cmd->add_flag("--tensors", opts->tensors,
                "Also list every tensor: name, type, shape (ggml order), bytes, data offset");
  cmd->add_flag("--metadata", opts->metadata, "Also list every metadata key (long values shortened)");
  cmd->add_flag("--json", opts->json, "Print one JSON document instead of text, for scripts");
  cmd->footer(
      "The report has the sections Model, Architecture, Tokenizer and Tensors by type;\n"
      "facts a file does not hold are left out. --json holds the same facts, plus the\n"
      "tensors and metadata when asked for (arrays cut to 16 items, length given).\n"
      "\n" +
      architectures_text() +
      "\n"
      "Examples:\n"
      "  m40-llm show model.gguf\n"
      "  m40-llm show model.gguf --tensors --metadata\n"
      "  m40-llm show model.gguf --json | jq .architecture\n");
  cmd->callback([opts] { set_command_action([opts] { return run_show(*opts); }); });
}

}  // namespace m40::cli
