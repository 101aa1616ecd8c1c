#include "store/pull.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "common/error.h"
#include "gguf/split_name.h"
#include "store/huggingface.h"
#include "store/http_download.h"
#include "store/ollama_registry.h"
#include "store/progress.h"
#include "store/sha256.h"

namespace m40::store {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

std::string stem_of(const std::string& file) {
  std::string name = file.substr(file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1);
  if (is_gguf_file_name(name)) name.resize(name.size() - 5);
  return name;
}

// Org and repo names on Hugging Face: letters, digits, '-', '_', '.'.
bool valid_hf_part(const std::string& s) { return !s.empty() && try_parse_model_name(s + ":x").has_value(); }

PullRef hf_repo_ref(const std::string& ref, const std::string& body) {
  // body: ORG/REPO[:QUANT] or ORG/REPO/PATH.gguf
  PullRef r;
  std::string path = body;
  if (const size_t colon = body.rfind(':'); colon != std::string::npos && body.find('/', colon) == std::string::npos) {
    path = body.substr(0, colon);
    r.quant = body.substr(colon + 1);
    // ":latest" is the tag a pull without a quantization stores under, so
    // pulling that store name again means the default quantization too.
    if (r.quant == kDefaultTag) r.quant.clear();
  }
  auto parts = split(path, '/');
  if (parts.size() < 2 || !valid_hf_part(parts[0]) || !valid_hf_part(parts[1])) {
    throw Error("cannot read '" + ref + "' as a Hugging Face reference: use hf.co/ORG/REPO[:QUANT] or ORG/REPO/FILE.gguf");
  }
  r.org = parts[0];
  r.repo = parts[1];
  const std::string repo_name = "hf.co/" + r.org + "/" + r.repo;
  if (parts.size() == 2) {
    r.kind = SourceKind::HuggingFaceRepo;
    r.default_name = parse_model_name(repo_name + ":" + (r.quant.empty() ? std::string(kDefaultTag) : r.quant));
    return r;
  }
  r.kind = SourceKind::HuggingFaceFile;
  r.file = path.substr(r.org.size() + r.repo.size() + 2);
  if (!is_gguf_file_name(r.file) || !r.quant.empty()) {
    throw Error("cannot read '" + ref + "': a file in a Hugging Face repository must end in .gguf");
  }
  std::string tag = quant_from_file_name(stem_of(r.file) + ".gguf");
  if (tag.empty()) tag = sanitize_name_component(stem_of(r.file));
  r.default_name = {repo_name, tag};
  return r;
}

void remove_empty_dirs(const Store& store, const ModelName& name) {
  std::error_code ec;
  fs::path dir = store.model_dir(name);
  while (dir != store.models_dir() && dir.has_parent_path()) {
    if (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec) || ec) break;
    fs::remove(dir, ec);
    dir = dir.parent_path();
  }
}

void remove_file(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

// The partial file goes with the record of what it is.
void remove_partial(const fs::path& partial) {
  remove_file(partial);
  remove_file(partial_record_path(partial));
}

// Writes all of `data` to `fd`; false with errno set when the disk refuses.
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Copies a local file into the partial file `to`, which the caller holds
// locked (so that a download of the same name in flight kept its bytes),
// hashing as it goes.
std::string copy_with_hash(const fs::path& from, const LockedPartial& out, const fs::path& to,
                           const std::function<void(uint64_t, std::optional<uint64_t>)>& report,
                           const std::function<bool()>& interrupted) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw Error("cannot read " + from.string() + ": " + std::strerror(errno));
  if (::ftruncate(out.fd(), 0) != 0) throw DiskError("cannot truncate " + to.string() + ": " + std::strerror(errno), errno);
  std::error_code ec;
  const uint64_t total = fs::file_size(from, ec);
  Sha256 hash;
  std::vector<char> buffer(1 << 20);
  uint64_t done = 0;
  while (in) {
    if (interrupted && interrupted()) throw InterruptedError("interrupted; nothing was stored");
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    if (!write_all(out.fd(), buffer.data(), got)) {
      throw DiskError("cannot write " + to.string() + ": " + std::strerror(errno), errno);
    }
    hash.update(buffer.data(), got);
    done += got;
    report(done, total);
  }
  if (in.bad()) throw Error("cannot read " + from.string());
  return hash.hex_digest();
}

// What to do when the store cannot be written to at all.
std::string disk_hint(int error_number) {
  if (error_number == EACCES || error_number == EPERM || error_number == EROFS) {
    return "; make the store writable or set M40_LLM_HOME to a folder you can write";
  }
  return "";
}

std::string short_sha(const std::string& sha) { return sha.substr(0, 12); }

const char* kPullForms =
    "give a URL, hf.co/ORG/REPO[:QUANT], ORG/REPO/FILE.gguf, an Ollama library name (NAME[:TAG], NAMESPACE/NAME[:TAG]) "
    "or a GGUF file";
const char* kRemotePullForms =
    "give an http(s) URL, hf.co/ORG/REPO[:QUANT], ORG/REPO/FILE.gguf or an Ollama library name (NAME[:TAG], "
    "NAMESPACE/NAME[:TAG]); local files are not pulled here";

// "template, params" for the log: which Ollama text layers were kept.
std::string kept_layers(const OllamaExtras& x) {
  std::string list;
  const auto add = [&](bool present, const char* what) {
    if (present) list += (list.empty() ? "" : ", ") + std::string(what);
  };
  add(!x.template_text.empty(), "template");
  add(!x.params.empty(), "params");
  add(!x.system.empty(), "system message");
  add(!x.licenses.empty(), "license");
  return list;
}

// The most bytes the model may have: what the store's disk has free (plus
// what partial downloads of it hold already), and the caller's cap.
std::optional<SizeCap> size_cap(const fs::path& dir, const std::vector<fs::path>& partials,
                                const std::optional<SizeCap>& max_size) {
  std::optional<SizeCap> cap;
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available != static_cast<std::uintmax_t>(-1)) {
    uint64_t held = 0;
    for (const auto& partial : partials) {
      std::error_code size_ec;
      const uint64_t n = fs::file_size(partial, size_ec);
      if (!size_ec) held += n;
    }
    cap = SizeCap{space.available + held, "the " + human_size(space.available) + " free on the store's disk"};
  }
  if (max_size && (!cap || max_size->bytes < cap->bytes)) cap = max_size;
  return cap;
}

// One file to fetch: the whole model, or one part of a split one.
struct PartSource {
  std::string url;
  std::optional<std::string> expected_sha;
  std::optional<uint64_t> expected_size;
  fs::path partial;  // where its bytes gather
  std::string sha;   // of what arrived
  uint64_t size = 0;
};

// "part 2 of 3"
std::string part_text(size_t index, size_t count) {
  return "part " + std::to_string(index + 1) + " of " + std::to_string(count);
}

// Gives a split model's parts, downloaded and verified, gguf-split names
// beside them (hard links, else symbolic ones), so that the GGUF reader
// opens them as one model as it will once they are installed; the names go
// again with this object.
class SplitCheckNames {
 public:
  SplitCheckNames(const fs::path& dir, const std::vector<PartSource>& parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      const fs::path link = dir / gguf::split_file_name("verifying", i + 1, parts.size());
      std::error_code ec;
      fs::remove(link, ec);
      fs::create_hard_link(parts[i].partial, link, ec);
      if (ec) {
        ec.clear();
        fs::create_symlink(parts[i].partial.filename(), link, ec);
      }
      if (ec) throw Error("cannot check the parts of the model in " + dir.string() + ": " + ec.message());
      links_.push_back(link);
    }
  }
  ~SplitCheckNames() {
    for (const auto& link : links_) {
      std::error_code ec;
      fs::remove(link, ec);
    }
  }
  SplitCheckNames(const SplitCheckNames&) = delete;
  SplitCheckNames& operator=(const SplitCheckNames&) = delete;
  const fs::path& first() const { return links_.front(); }

 private:
  std::vector<fs::path> links_;
};

}  // namespace

PullRef parse_pull_ref(const std::string& ref, bool local_files) {
  if (ref.empty()) throw Error(std::string("nothing to pull: ") + (local_files ? kPullForms : kRemotePullForms));
  if (ref.starts_with("http://") || ref.starts_with("https://")) {
    PullRef r;
    r.kind = SourceKind::Url;
    r.location = ref;
    std::string path = ref.substr(0, ref.find_first_of("?#"));
    r.default_name = {sanitize_name_component(stem_of(path)), kDefaultTag};
    return r;
  }
  std::error_code ec;
  // A folder named like a model ("qwen3" in the current directory) does not
  // hide the Ollama name, as a folder does not hide a stored model for `run`.
  const bool is_directory = local_files && fs::is_directory(ref, ec);
  if (local_files && !is_directory && fs::exists(ref, ec)) {
    if (!fs::is_regular_file(ref, ec)) throw Error(ref + " is not a file");
    PullRef r;
    r.kind = SourceKind::LocalFile;
    r.location = ref;
    r.default_name = {sanitize_name_component(stem_of(ref)), kDefaultTag};
    return r;
  }
  for (const char* prefix : {"hf.co/", "huggingface.co/", "https://huggingface.co/"}) {
    if (ref.starts_with(prefix)) return hf_repo_ref(ref, ref.substr(std::strlen(prefix)));
  }
  const bool looks_like_path = ref.starts_with('/') || ref.starts_with('.');
  if (!looks_like_path && is_gguf_file_name(ref) && split(ref, '/').size() >= 3) {
    return hf_repo_ref(ref, ref);
  }
  if (!looks_like_path && !is_gguf_file_name(ref)) {
    if (const auto name = parse_ollama_name(ref)) {
      PullRef r;
      r.kind = SourceKind::OllamaLibrary;
      r.ollama = *name;
      r.default_name = name->store_name();
      return r;
    }
  }
  // The same answer for every path, whatever the file system holds.
  if (!local_files) throw Error("cannot pull '" + ref + "': " + kRemotePullForms);
  if (is_directory) throw Error(ref + " is a directory, not a GGUF file");
  if (is_gguf_file_name(ref) || looks_like_path) throw Error("no such file: " + ref);
  throw Error("cannot tell where to pull '" + ref + "' from: " + kPullForms);
}

PullResult pull_model(const Store& store, const PullOptions& options) {
  const PullRef ref = parse_pull_ref(options.ref, options.local_files);
  // Every request of the pull: where it may connect, and when it stops.
  const RequestPolicy policy{options.address_allowed, options.interrupted};
  const ModelName name = options.name ? parse_model_name(*options.name) : ref.default_name;
  std::FILE* log = options.log;

  // Where the bytes come from, and what the source says they must be: one
  // file, or the parts of a split model (Hugging Face), in order.
  std::vector<PartSource> parts(1);
  parts[0].url = ref.location;
  std::string source = ref.location;
  std::map<std::string, std::string> headers;
  if (ref.kind == SourceKind::HuggingFaceRepo || ref.kind == SourceKind::HuggingFaceFile) {
    const std::string label = "hf.co/" + ref.org + "/" + ref.repo;
    const auto files = hf_list_files(ref.org, ref.repo, policy);
    HfFile chosen;
    if (ref.kind == SourceKind::HuggingFaceRepo) {
      chosen = select_gguf(files, ref.quant, label);
    } else {
      const auto it = std::find_if(files.begin(), files.end(), [&](const HfFile& f) { return f.path == ref.file; });
      if (it == files.end()) throw Error("file " + ref.file + " not found in " + label);
      chosen = *it;
    }
    parts.clear();
    for (const HfFile& f : model_files(files, chosen, label)) {
      PartSource part;
      part.url = hf_file_url(ref.org, ref.repo, f.path);
      part.expected_sha = f.sha256;
      if (f.size > 0) part.expected_size = f.size;
      parts.push_back(std::move(part));
    }
    source = parts.front().url;
    headers = hf_headers();
  }
  std::optional<OllamaManifest> ollama_manifest;
  if (ref.kind == SourceKind::OllamaLibrary) {
    // The model layer is a plain download of a blob named by its sha256.
    ollama_manifest = fetch_ollama_manifest(ref.ollama, policy);
    parts[0].url = ollama_blob_url(ref.ollama, ollama_manifest->model.sha256);
    source = parts[0].url;
    parts[0].expected_sha = ollama_manifest->model.sha256;
    if (ollama_manifest->model.size > 0) parts[0].expected_size = ollama_manifest->model.size;
  }
  const bool split = parts.size() > 1;
  const auto count = static_cast<uint32_t>(parts.size());
  for (uint32_t i = 0; i < count; ++i) {
    parts[i].partial = split ? store.model_dir(name) / (Store::part_file_name(i + 1, count) + ".partial")
                             : store.partial_path(name);
  }
  // The sha256 that names the model: its file's, or split_sha256 of every
  // part's (each of them known, or the whole is not).
  const auto model_sha = [&](auto sha_of) -> std::optional<std::string> {
    if (!split) return sha_of(parts[0]);
    std::vector<std::string> shas;
    for (const auto& p : parts) {
      const std::optional<std::string> sha = sha_of(p);
      if (!sha) return std::nullopt;
      shas.push_back(*sha);
    }
    return split_sha256(shas);
  };
  const std::optional<std::string> expected_model_sha =
      model_sha([](const PartSource& p) { return p.expected_sha; });

  const auto existing = store.find(name);
  if (existing && expected_model_sha && existing->sha256 == *expected_model_sha) {
    std::fprintf(log, "%s is up to date (sha256 %s)\n", name.str().c_str(), short_sha(existing->sha256).c_str());
    return {*existing, true};
  }
  // The small text layers come first: a failure there costs no download.
  std::optional<OllamaExtras> ollama_extras;
  if (ollama_manifest) {
    for (const auto& media_type : ollama_manifest->ignored) {
      std::fprintf(log, "not pulling the layer %s (m40-llm does not use it)\n", media_type.c_str());
    }
    ollama_extras = fetch_ollama_extras(ref.ollama, *ollama_manifest, policy);
  }

  std::error_code ec;
  fs::create_directories(store.model_dir(name), ec);
  if (ec) {
    // Name the folder that refused: the deepest one that exists.
    fs::path refused = store.model_dir(name);
    std::error_code exists_ec;
    while (refused.has_parent_path() && refused != refused.parent_path() && !fs::exists(refused, exists_ec)) {
      refused = refused.parent_path();
    }
    throw Error("cannot create a folder in " + refused.string() + ": " + ec.message() + disk_hint(ec.value()));
  }
  std::vector<fs::path> partials;
  for (const auto& p : parts) partials.push_back(p.partial);
  const std::optional<SizeCap> cap = size_cap(store.model_dir(name), partials, options.max_size);
  // A size known before the first byte (the source's listing, a local file)
  // is judged before anything is written; a split model's, for all parts.
  std::optional<uint64_t> known_size = 0;
  for (const auto& p : parts) {
    known_size = known_size && p.expected_size ? std::optional(*known_size + *p.expected_size) : std::nullopt;
  }
  if (ref.kind == SourceKind::LocalFile) {
    std::error_code size_ec;
    if (const uint64_t n = fs::file_size(ref.location, size_ec); !size_ec) known_size = n;
  }
  if (cap && known_size && *known_size > cap->bytes) {
    remove_empty_dirs(store, name);
    const std::string what =
        split ? "the " + std::to_string(count) + " parts of " + name.str() + " (" + source + " ...)" : source;
    throw DownloadRefusedError("refusing to pull " + what + ": " + (split ? "they are " : "it is ") + human_size(*known_size) +
                               ", more than " + cap->what + "; nothing was stored");
  }

  if (!split) std::fprintf(log, "pulling %s from %s\n", name.str().c_str(), source.c_str());
  else std::fprintf(log, "pulling %s in %u parts\n", name.str().c_str(), count);
  // The current part's progress; the caller hears of all parts' bytes together.
  std::optional<Progress> progress;
  uint64_t done_before = 0;
  const auto report = [&](uint64_t done, std::optional<uint64_t> total) {
    progress->update(done, total);
    if (!options.on_progress) return;
    if (!split) options.on_progress(done, total);
    else options.on_progress(done_before + done, known_size);
  };
  // What a failure leaves: only partial files with bytes worth resuming
  // (`all`: nothing).
  const auto clean_up = [&](bool all) {
    for (const auto& p : parts) {
      std::error_code size_ec;
      if (all || fs::file_size(p.partial, size_ec) == 0 || size_ec) remove_partial(p.partial);
    }
    remove_empty_dirs(store, name);
  };
  const auto abandon = [&] {
    if (progress) progress->abandon();
    progress.reset();
  };
  // The partial files' locks, held from before their first byte until the
  // model is in place or the pull has failed: a second pull of the name and
  // `rm` keep off its files meanwhile (BusyError).
  std::vector<std::unique_ptr<LockedPartial>> locks;
  try {
    for (const auto& p : parts) locks.push_back(std::make_unique<LockedPartial>(p.partial));
    for (size_t i = 0; i < parts.size(); ++i) {
      PartSource& part = parts[i];
      const std::string described = split ? part.url + " (" + part_text(i, count) + ")" : source;
      if (split) std::fprintf(log, "pulling %s %s from %s\n", name.str().c_str(), part_text(i, count).c_str(), part.url.c_str());
      progress.emplace(split ? name.str() + " " + part_text(i, count) : name.str(), options.terminal, log);
      if (ref.kind == SourceKind::LocalFile) {
        source = fs::absolute(ref.location).lexically_normal().string();
        part.sha = copy_with_hash(ref.location, *locks[i], part.partial, report, options.interrupted);
        part.size = fs::file_size(part.partial);
      } else {
        DownloadRequest request;
        request.url = part.url;
        request.partial = part.partial;
        request.locked = locks[i].get();
        request.expected_size = part.expected_size;
        request.headers = headers;
        request.on_progress = report;
        request.on_notice = [&](const std::string& text) { progress->notice(text); };
        request.interrupted = options.interrupted;
        request.address_allowed = options.address_allowed;
        request.max_size = cap;
        if (cap && split) {
          // What this part may take of the cap: what the others will not.
          uint64_t others = 0;
          for (const auto& o : parts) others += &o == &part ? 0 : o.expected_size.value_or(0);
          request.max_size->bytes = cap->bytes > others ? cap->bytes - others : 0;
        }
        request.gguf = true;
        DownloadResult result;
        try {
          result = download_file(request);
        } catch (const HttpStatusError& e) {
          if (!split) throw;
          throw HttpStatusError(name.str() + " " + part_text(i, count) + " cannot be fetched: " + e.what(), e.status());
        }
        if (split && result.resumed_from > 0 && result.resumed_from == result.size && part.expected_size) {
          // Nothing was fetched, so there is no progress to show.
          progress.reset();
          std::fprintf(log, "%s was downloaded before (%llu bytes)\n", part_text(i, count).c_str(),
                       static_cast<unsigned long long>(result.size));
        } else if (result.resumed_from > 0) {
          std::fprintf(log, "resumed a partial download at %llu bytes\n", static_cast<unsigned long long>(result.resumed_from));
        }
        part.sha = result.sha256;
        part.size = result.size;
        if (!part.expected_sha) part.expected_sha = result.linked_sha256;
      }
      if (progress) progress->finish();
      progress.reset();
      done_before += part.size;
      // A part that is not what the source said is deleted at once: the
      // next pull fetches it again (and keeps the parts that were right).
      if (part.expected_size && part.size != *part.expected_size) {
        remove_partial(part.partial);
        throw Error("download of " + described + " is corrupt: " + std::to_string(part.size) + " bytes instead of " +
                    std::to_string(*part.expected_size) + "; it was deleted, pull again");
      }
      if (part.expected_sha && part.sha != *part.expected_sha) {
        remove_partial(part.partial);
        throw Error("download of " + described + " is corrupt: sha256 " + part.sha + " does not match the expected " +
                    *part.expected_sha + "; it was deleted, pull again");
      }
    }
  } catch (const BusyError&) {
    // The partial files and their folder are the other pull's: leave them.
    abandon();
    throw;
  } catch (const DiskError& e) {
    abandon();
    // A disk that refused a write leaves nothing behind.
    clean_up(true);
    throw Error(std::string(e.what()) + "; nothing was stored" + disk_hint(e.error_number()));
  } catch (const DownloadRefusedError& e) {
    abandon();
    // Bytes of a file that cannot be stored are worth nothing.
    clean_up(true);
    throw DownloadRefusedError(std::string(e.what()) + "; nothing was stored");
  } catch (const InterruptedError&) {
    abandon();
    // A copy starts over anyway; a download's bytes are kept for a resume.
    clean_up(ref.kind == SourceKind::LocalFile);
    throw;
  } catch (const Error&) {
    abandon();
    // A network failure (or an HTTP error) keeps what arrived, for the next
    // pull to resume.
    clean_up(false);
    throw;
  }

  const auto refuse = [&](const std::string& why) {
    clean_up(true);
    throw Error(why);
  };
  Manifest manifest;
  try {
    if (!split) {
      describe_gguf(parts[0].partial, manifest);
    } else {
      // The parts must make one model, as the loader will read them.
      const SplitCheckNames names(store.model_dir(name), parts);
      describe_gguf(names.first(), manifest);
    }
  } catch (const Error& e) {
    if (!split) refuse(source + " is not a valid GGUF file (" + e.what() + "); nothing was stored");
    refuse("the " + std::to_string(count) + " parts of " + name.str() + " from " + source + " are not one valid GGUF model (" +
           e.what() + "); nothing was stored");
  }
  const std::string sha = *model_sha([](const PartSource& p) { return std::optional(p.sha); });
  uint64_t size = 0;
  for (const auto& p : parts) size += p.size;
  if (existing && existing->sha256 == sha) {
    for (const auto& p : parts) remove_partial(p.partial);
    std::fprintf(log, "%s is up to date (sha256 %s)\n", name.str().c_str(), short_sha(sha).c_str());
    return {*existing, true};
  }
  manifest.source = source;
  manifest.size = size;
  manifest.sha256 = sha;
  manifest.ollama = ollama_extras;
  if (split) {
    for (uint32_t i = 0; i < count; ++i) {
      manifest.parts.push_back({Store::part_file_name(i + 1, count), parts[i].size, parts[i].sha});
    }
  }
  try {
    manifest = store.install(name, partials, manifest);
  } catch (const Error& e) {
    // Same rule as a disk error during the download: nothing half-made stays.
    for (const auto& p : parts) remove_partial(p.partial);
    remove_file(store.model_dir(name) / "manifest.json.tmp");
    // With no model there before, model files without a manifest are ours.
    if (!existing) {
      remove_file(store.gguf_path(name));
      for (uint32_t i = 0; i < count; ++i) remove_file(store.model_dir(name) / Store::part_file_name(i + 1, count));
    }
    remove_empty_dirs(store, name);
    throw Error(std::string(e.what()) + "; nothing was stored");
  }
  for (const auto& p : parts) remove_file(partial_record_path(p.partial));
  // "verified" only when there was a hash to compare with.
  bool all_checked = true;
  for (const auto& p : parts) all_checked = all_checked && p.expected_sha.has_value();
  if (!split) {
    if (all_checked) std::fprintf(log, "verified sha256 %s (matches the source)\n", short_sha(sha).c_str());
    else std::fprintf(log, "sha256 %s (the source gave none to check against)\n", short_sha(sha).c_str());
    std::fprintf(log, "stored %s (%s, %s)\n", name.str().c_str(), human_size(size).c_str(),
                 manifest.quant.empty() ? "unknown type" : manifest.quant.c_str());
  } else {
    if (all_checked) std::fprintf(log, "verified the sha256 of each of the %u parts (they match the source)\n", count);
    else std::fprintf(log, "sha256 of the %u parts: %s (the source gave none to check some against)\n", count,
                      short_sha(sha).c_str());
    std::fprintf(log, "stored %s (%s in %u parts, %s)\n", name.str().c_str(), human_size(size).c_str(), count,
                 manifest.quant.empty() ? "unknown type" : manifest.quant.c_str());
  }
  if (ollama_extras && !kept_layers(*ollama_extras).empty()) {
    std::fprintf(log, "kept its Ollama %s in manifest.json (not used: the GGUF's own chat template is)\n",
                 kept_layers(*ollama_extras).c_str());
  }
  return {manifest, false};
}

}  // namespace m40::store
