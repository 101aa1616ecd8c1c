// Models loaded on demand, Ollama-style: a request names a model (a store
// name or a GGUF path), and the manager loads it when it is not the one
// resident. One model is resident at a time. A request for another model
// waits until the running requests of the resident one have finished (new
// requests for the resident model wait too, so a switch is never starved),
// then the old model is unloaded and the new one loaded (its file is opened
// and checked first: a file that cannot be used leaves the old model
// resident, and a load that fails past that point reloads it). A request that asks
// for a context size (Ollama's num_ctx) other than the resident model's is a
// request for another model in this sense: the model is reloaded with that
// context, as Ollama does. A model idle for its keep_alive is unloaded.
//
//   auto lease = models.acquire("tiny:q8_0", keep_alive);  // loads if needed
//   lease->model().scheduler->submit(...);                 // held while used
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "chat/model_template.h"
#include "engine/scheduler.h"
#include "chat/tool_call_format.h"
#include "grammar/token_vocabulary.h"
#include "model/loaded_model.h"
#include "server/keep_alive.h"
#include "server/server_options.h"
#include "tokenizer/vocab.h"

namespace m40::server {

// A model with its engine. Members are destroyed bottom-up: the scheduler
// stops before the backend and the file go.
struct ResidentModel {
  std::string name;  // as the APIs call it: "tiny:q8_0", or the file name without .gguf
  std::string path;  // canonical path of the GGUF file
  uint64_t size = 0;
  int gpu_layers = -1;  // the layers on GPUs it was loaded with: the request's num_gpu, else --gpu-layers
  std::chrono::system_clock::time_point loaded_at{};
  double load_seconds = 0;
  size_t max_token_bytes = 0;  // prompt_tokens.h: the most text bytes one token stands for
  std::unique_ptr<model::LoadedModel> model;
  std::unique_ptr<tokenizer::Vocab> vocab;
  std::optional<chat::ModelChatTemplate> chat_template;
  // tokenizer.chat_template.tool_use where the model has one (Hermes-style
  // files keep the tool-calling template apart): used for requests with tools.
  std::optional<chat::ModelChatTemplate> tool_use_template;
  chat::TemplateTraits template_traits;  // of the template tool requests use
  // The vocabulary as the grammar engine reads it, built by the first
  // constrained request (chat_features.cpp) and shared by the rest.
  std::mutex grammar_vocabulary_mutex;
  std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<engine::Scheduler> scheduler;
};

// A model a request names: its API name and its file, and the context
// size and the layers on GPUs it asks for.
struct ModelTarget {
  std::string name;
  std::string path;     // canonical
  int n_ctx = 0;        // positions per sequence asked for (num_ctx); 0: any, the server's when loading
  int gpu_layers = -1;  // layers on the GPUs asked for (num_gpu); -1: any, the server's when loading
};

class ModelManager;

// Keeps the resident model loaded while a request uses it.
class ModelLease {
 public:
  ModelLease(ModelManager& manager, std::shared_ptr<ResidentModel> model, KeepAlive keep_alive, double load_seconds)
      : manager_(manager), model_(std::move(model)), keep_alive_(keep_alive), load_seconds_(load_seconds) {}
  ~ModelLease() { release(); }
  ModelLease(const ModelLease&) = delete;
  ModelLease& operator=(const ModelLease&) = delete;

  ResidentModel& model() const { return *model_; }
  // Seconds this request waited for the model to load (0 when it was loaded).
  double load_seconds() const { return load_seconds_; }
  // Lets the model go (idempotent): its keep_alive starts now.
  void release();

 private:
  ModelManager& manager_;
  std::shared_ptr<ResidentModel> model_;
  KeepAlive keep_alive_;
  double load_seconds_;
  bool released_ = false;
};

// What /api/ps shows of the resident model.
struct LoadedModelInfo {
  std::shared_ptr<ResidentModel> model;
  std::optional<std::chrono::system_clock::time_point> expires_at;  // nullopt: never
  int users = 0;
};

class ModelManager {
 public:
  ModelManager(const ServerOptions& options);
  ~ModelManager();  // stop()
  ModelManager(const ModelManager&) = delete;
  ModelManager& operator=(const ModelManager&) = delete;

  // The model of requests that name none (`serve MODEL`); loaded now.
  // Throws m40::Error when it cannot be found or loaded.
  void load_default(const std::string& ref);

  // The model a request names ("" or absent: the default model, else the
  // resident one). Throws HttpError 404 when it is neither a store model nor
  // a GGUF file, 400 when none is named and none is loaded.
  ModelTarget resolve(const std::string& ref) const;

  // The named model, loaded when it is not resident; waits while another
  // model finishes its requests or loads. Throws HttpError: 404 unknown
  // model, 500 load failure (the server keeps running), 503 stopping.
  // `n_ctx` > 0 asks for at least that context per sequence (reloading the model
  // when the resident one has another); 0 takes the model as it is loaded.
  // `gpu_layers` >= 0 asks for that many layers on the GPUs (Ollama's
  // num_gpu; engine::BackendOptions::gpu_layers), reloading a model loaded
  // with another count; -1 takes the model as it is loaded. Asking for
  // layers on a GPU where the server has none (or runs --cpu) is a 400.
  std::shared_ptr<ModelLease> acquire(const std::string& ref, std::optional<KeepAlive> keep_alive, int n_ctx = 0,
                                      int gpu_layers = -1);

  // Unloads the resident model now when no request uses it (keep_alive 0 on
  // an empty request). Returns whether it was unloaded.
  bool unload_if_idle(const std::string& path);

  bool loading() const;
  std::optional<LoadedModelInfo> resident() const;
  // The default model's target, when serve was given one.
  std::optional<ModelTarget> default_model() const;
  // Counters of every scheduler so far (unloaded ones included).
  engine::SchedulerStats stats() const;
  KeepAlive default_keep_alive() const { return options_.keep_alive; }

  void stop();

 private:
  friend class ModelLease;
  void release(const std::shared_ptr<ResidentModel>& model, KeepAlive keep_alive);
  // The file, its vocabulary and chat template, checked: what fails for a
  // corrupt file, before anything is unloaded. Cheap (the file is mapped).
  std::shared_ptr<ResidentModel> open_model(const ModelTarget& target) const;
  // The backend and scheduler of an opened model: the memory.
  void start_model(ResidentModel& m, const ModelTarget& target) const;
  // Takes the resident model out (caller holds the lock); it is destroyed
  // by the caller after unlocking, since stopping a scheduler joins a thread.
  std::shared_ptr<ResidentModel> take_resident();
  void reap_idle();

  ServerOptions options_;
  std::optional<ModelTarget> default_;
  std::optional<std::string> default_ref_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::shared_ptr<ResidentModel> resident_;
  int users_ = 0;
  std::optional<std::chrono::steady_clock::time_point> expires_;  // nullopt: never
  std::chrono::system_clock::time_point expires_wall_{};
  bool loading_ = false;
  std::optional<ModelTarget> wanted_;  // a waiting request's model: the resident one's new requests wait too
  bool stopping_ = false;
  engine::SchedulerStats retired_;  // counters of unloaded schedulers
  std::thread reaper_;
};

}  // namespace m40::server
