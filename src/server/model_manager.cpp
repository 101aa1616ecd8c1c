#include "server/model_manager.h"

#include <cstdio>
#include <filesystem>

#include "common/error.h"
#include "engine/backend_factory.h"
#include "server/http_error.h"
#include "server/prompt_tokens.h"
#include "store/model_name.h"
#include "store/model_ref.h"

namespace m40::server {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

namespace {

std::string canonical(const std::string& path) {
  std::error_code ec;
  auto p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// The API name of a model: a store name in full ("tiny" -> "tiny:latest"),
// a file by its name without .gguf.
std::string api_name(const std::string& ref) {
  std::error_code ec;
  if (fs::is_regular_file(ref, ec)) return fs::path(ref).stem().string();
  if (auto name = store::try_parse_model_name(ref)) return name->str();
  return ref;
}

// Whether a request's model reads as a file path (refused without
// --allow-paths, by the text alone: the file system is not asked).
bool looks_like_path(const std::string& ref) {
  return ref.starts_with('/') || ref.starts_with('.') || ref.starts_with('~') ||
         ref.find('\\') != std::string::npos || store::is_gguf_file_name(ref);
}

// "x" and "x:latest" name the same model.
bool same_name(const std::string& a, const std::string& b) {
  auto full = [](const std::string& n) { return n.find(':') == std::string::npos ? n + ":latest" : n; };
  return a == b || full(a) == full(b);
}

void add_counters(engine::SchedulerStats& to, const engine::SchedulerStats& from) {
  to.requests_total += from.requests_total;
  to.requests_rejected += from.requests_rejected;
  to.requests_failed += from.requests_failed;
  to.requests_cancelled += from.requests_cancelled;
  to.prompt_tokens += from.prompt_tokens;
  to.prompt_tokens_cached += from.prompt_tokens_cached;
  to.preemptions += from.preemptions;
  to.generated_tokens += from.generated_tokens;
  to.steps += from.steps;
  to.slice_steps += from.slice_steps;
}

// Whether the resident model answers a request for `target`: the same
// file, with at least the context asked for (a request for less runs
// within its own limit: the KV pool is shared, nothing is reserved).
bool serves(const ResidentModel& resident, const ModelTarget& target) {
  return resident.path == target.path && (target.n_ctx == 0 || resident.backend->n_ctx() >= target.n_ctx) &&
         (target.gpu_layers < 0 || resident.gpu_layers == target.gpu_layers);
}

// Whether two waiting requests want the same load.
bool same_model(const ModelTarget& a, const ModelTarget& b) {
  return a.path == b.path && a.n_ctx == b.n_ctx && a.gpu_layers == b.gpu_layers;
}

}  // namespace

void ModelLease::release() {
  if (released_) return;
  released_ = true;
  manager_.release(model_, keep_alive_);
}

ModelManager::ModelManager(const ServerOptions& options) : options_(options) {
  reaper_ = std::thread([this] { reap_idle(); });
}

ModelManager::~ModelManager() { stop(); }

void ModelManager::load_default(const std::string& ref) {
  ModelTarget target{api_name(ref), canonical(store::resolve_model(ref))};
  {
    std::lock_guard lock(mutex_);
    default_ = target;
    default_ref_ = ref;
  }
  try {
    acquire(ref, std::nullopt);  // the lease ends at once: the keep_alive clock starts
  } catch (const HttpError& e) {
    throw Error(e.message);
  }
}

ModelTarget ModelManager::resolve(const std::string& ref) const {
  {
    std::lock_guard lock(mutex_);
    if (ref.empty()) {
      if (default_) return *default_;
      if (resident_) return {resident_->name, resident_->path};
      throw HttpError{400, "'model' is required: name a model of the store (GET /api/tags) or a GGUF file"};
    }
    if (default_ && (same_name(ref, default_->name) || ref == *default_ref_)) return *default_;
    if (resident_ && same_name(ref, resident_->name)) return {resident_->name, resident_->path};
  }
  try {
    if (options_.allow_paths) return {api_name(ref), canonical(store::resolve_model(ref))};
    // The store only: what the file system holds elsewhere changes nothing
    // of the answer (a client must not learn whether /etc/shadow exists).
    try {
      const std::string path = store::resolve_stored_model(ref);
      return {store::parse_model_name(ref).str(), canonical(path)};
    } catch (const Error&) {
      if (!looks_like_path(ref)) throw;
    }
    throw Error("'" + ref + "' reads as a file path: this server loads the models of its store (GET /api/tags), "
                "not files a request names (start it with --allow-paths to allow that)");
  } catch (const Error& e) {
    throw HttpError{404, e.what(), "invalid_request_error", "model_not_found"};
  }
}

std::shared_ptr<ModelLease> ModelManager::acquire(const std::string& ref, std::optional<KeepAlive> keep_alive,
                                                  int n_ctx, int gpu_layers) {
  if (n_ctx < 0) throw HttpError{400, "num_ctx must be positive"};
  if (gpu_layers > 0 && (options_.force_cpu || !engine::gpu_available())) {
    throw HttpError{400, "options.num_gpu " + std::to_string(gpu_layers) + " asks for layers on a GPU, and this server " +
                             (options_.force_cpu ? "runs its models on the CPU (--cpu)" : "has no CUDA GPU") +
                             ": use 0 or leave it out"};
  }
  ModelTarget target = resolve(ref);
  target.n_ctx = n_ctx;
  target.gpu_layers = gpu_layers;
  const KeepAlive ka = keep_alive.value_or(options_.keep_alive);
  std::unique_lock lock(mutex_);
  bool waited_for_load = false;
  const auto asked = SteadyClock::now();
  for (;;) {
    if (stopping_) throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
    const bool switch_pending = wanted_ && !same_model(*wanted_, target);
    if (!loading_ && !switch_pending && resident_ && serves(*resident_, target)) {
      ++users_;
      const double waited = waited_for_load ? std::chrono::duration<double>(SteadyClock::now() - asked).count() : 0.0;
      return std::make_shared<ModelLease>(*this, resident_, ka, waited);
    }
    if (!loading_ && !switch_pending && users_ == 0) break;  // this request loads it
    if (!switch_pending && resident_ && !serves(*resident_, target)) wanted_ = target;
    waited_for_load = true;
    cv_.wait(lock);
  }

  loading_ = true;
  wanted_.reset();
  // The resident model (idle: users_ is 0) stays until the new file has
  // opened: a request naming a file that cannot be used changes nothing.
  std::optional<ModelTarget> previous;
  if (resident_) {
    previous = ModelTarget{resident_->name, resident_->path, resident_->backend->n_ctx(), resident_->gpu_layers};
  }
  lock.unlock();
  std::shared_ptr<ResidentModel> fresh;
  std::string failure;
  bool unloaded = false;
  try {
    fresh = open_model(target);
    lock.lock();
    auto old = take_resident();
    lock.unlock();
    unloaded = old != nullptr;
    old.reset();  // stops its scheduler and frees its memory for the new one
    start_model(*fresh, target);
  } catch (const std::exception& e) {
    failure = e.what();
    fresh.reset();
  }
  // The new model did not fit where the old one did (memory): the old one
  // comes back, so a bad request costs a reload, not the server's model.
  std::shared_ptr<ResidentModel> restored;
  if (!fresh && unloaded && previous) {
    try {
      restored = open_model(*previous);
      start_model(*restored, *previous);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "m40-llm: could not reload '%s' after a failed load: %s\n", previous->name.c_str(), e.what());
      restored.reset();
    }
  }
  lock.lock();
  loading_ = false;
  cv_.notify_all();
  if (!fresh) {
    if (restored) resident_ = restored;
    throw HttpError{500, "cannot load model '" + target.name + "': " + failure, "server_error", "model_load_failed"};
  }
  resident_ = fresh;
  users_ = 1;
  expires_.reset();
  return std::make_shared<ModelLease>(*this, fresh, ka, fresh->load_seconds);
}

std::shared_ptr<ResidentModel> ModelManager::open_model(const ModelTarget& target) const {
  const auto start = SteadyClock::now();
  auto m = std::make_shared<ResidentModel>();
  m->name = target.name;
  m->path = target.path;
  m->model = model::LoadedModel::open(target.path);
  m->vocab = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_metadata(m->model->file.metadata()));
  if (!options_.chat_template.empty()) {
    m->chat_template.emplace(chat::model_chat_template_from_source(m->model->file.metadata(), options_.chat_template));
  } else {
    m->chat_template.emplace(chat::model_chat_template(m->model->file));
  }
  if (options_.chat_template.empty() && m->model->file.metadata().find("tokenizer.chat_template.tool_use") != nullptr) {
    m->tool_use_template.emplace(chat::model_chat_template(m->model->file, "tool_use"));
  }
  const tokenizer::Vocab& vocab = *m->vocab;
  m->template_traits = chat::template_traits((m->tool_use_template ? *m->tool_use_template : *m->chat_template).chat_template.source(),
                                             [&vocab](std::string_view text) { return vocab.find(text).has_value(); });
  m->max_token_bytes = max_token_bytes(*m->vocab);
  m->load_seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return m;
}

void ModelManager::start_model(ResidentModel& m, const ModelTarget& target) const {
  const auto start = SteadyClock::now();
  engine::BackendOptions bo;
  bo.n_ctx = target.n_ctx > 0 ? target.n_ctx : options_.n_ctx;
  bo.n_seq = options_.parallel;
  bo.threads = options_.threads;
  bo.force_cpu = options_.force_cpu;
  bo.gpu = options_.gpu;
  bo.gpu_layers = target.gpu_layers >= 0 ? target.gpu_layers : options_.gpu_layers;
  m.gpu_layers = bo.gpu_layers;
  bo.gpus = options_.gpus;
  bo.tensor_split = options_.tensor_split;
  bo.split_mode = options_.split_mode;
  bo.vram_budget = options_.vram_budget;
  bo.kv_pool_bytes = options_.kv_pool_bytes;
  bo.kv_pool_fraction = options_.kv_pool_fraction;
  bo.kv_type = options_.kv_type;
  m.backend = engine::make_backend(*m.model, bo);
  if (options_.wrap_backend) m.backend = options_.wrap_backend(std::move(m.backend));
  m.scheduler = std::make_unique<engine::Scheduler>(
      *m.backend, *m.vocab,
      engine::SchedulerOptions{.max_queue = options_.max_queue,
                               .prefill_chunk = options_.prefill_chunk,
                               .prefill_slowdown = options_.prefill_slowdown});
  m.size = m.model->file.total_size();  // every part of a split model
  m.loaded_at = std::chrono::system_clock::now();
  m.load_seconds += std::chrono::duration<double>(SteadyClock::now() - start).count();
}

std::shared_ptr<ResidentModel> ModelManager::take_resident() {
  if (resident_ && resident_->scheduler) add_counters(retired_, resident_->scheduler->stats());
  expires_.reset();
  return std::move(resident_);
}

void ModelManager::release(const std::shared_ptr<ResidentModel>& model, KeepAlive keep_alive) {
  std::shared_ptr<ResidentModel> unloaded;
  {
    std::lock_guard lock(mutex_);
    if (model != resident_) return;  // already gone (stop())
    --users_;
    if (keep_alive.forever) {
      expires_.reset();
    } else {
      expires_ = SteadyClock::now() + keep_alive.duration;
      expires_wall_ = std::chrono::system_clock::now() + keep_alive.duration;
    }
    if (users_ == 0 && keep_alive.unload_at_once() && !wanted_) unloaded = take_resident();
    cv_.notify_all();
  }
}

bool ModelManager::unload_if_idle(const std::string& path) {
  std::shared_ptr<ResidentModel> unloaded;
  {
    std::lock_guard lock(mutex_);
    if (!resident_ || resident_->path != path || users_ > 0 || loading_) return false;
    unloaded = take_resident();
    cv_.notify_all();
  }
  return true;
}

void ModelManager::reap_idle() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const bool idle = resident_ && users_ == 0 && !loading_ && !wanted_;
    if (idle && expires_) {
      if (SteadyClock::now() >= *expires_) {
        auto unloaded = take_resident();
        lock.unlock();
        unloaded.reset();
        lock.lock();
        cv_.notify_all();
        continue;
      }
      cv_.wait_until(lock, *expires_);
    } else {
      cv_.wait(lock);
    }
  }
}

bool ModelManager::loading() const {
  std::lock_guard lock(mutex_);
  return loading_;
}

std::optional<LoadedModelInfo> ModelManager::resident() const {
  std::lock_guard lock(mutex_);
  if (!resident_) return std::nullopt;
  LoadedModelInfo info{resident_, std::nullopt, users_};
  if (expires_) info.expires_at = expires_wall_;
  return info;
}

std::optional<ModelTarget> ModelManager::default_model() const {
  std::lock_guard lock(mutex_);
  return default_;
}

engine::SchedulerStats ModelManager::stats() const {
  std::lock_guard lock(mutex_);
  engine::SchedulerStats st = retired_;
  if (resident_ && resident_->scheduler) {
    const auto now = resident_->scheduler->stats();
    add_counters(st, now);
    st.queue_depth = now.queue_depth;
    st.slots_busy = now.slots_busy;
    st.slots_total = now.slots_total;
    st.kv_cells_used = now.kv_cells_used;
    st.kv_blocks_total = now.kv_blocks_total;
    st.kv_blocks_used = now.kv_blocks_used;
    st.kv_blocks_cached = now.kv_blocks_cached;
  }
  return st;
}

void ModelManager::stop() {
  std::shared_ptr<ResidentModel> unloaded;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !reaper_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  // Running requests end with the scheduler's "shutting down" event; their
  // leases still hold the model until their handlers return.
  std::lock_guard lock(mutex_);
  if (resident_ && resident_->scheduler) resident_->scheduler->stop();
}

}  // namespace m40::server
