#include "engine/forward/nccl_group.hpp"

#include <stdexcept>
#include <string>

#include "engine/forward/collective.hpp"

#if defined(TROUPE_HAVE_NCCL)

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>

namespace troupe {

namespace {

// The NCCL calls troupe makes, from the library loaded at run time.
struct nccl_api {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

// Loaded once per process; the handle stays open for the process's life.
expected<const nccl_api*> load_nccl() {
  static const expected<const nccl_api*> loaded = []() -> expected<const nccl_api*> {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      return error{std::string("NCCL (for tensor parallelism and device links on GPUs): libnccl.so.2 could not be loaded (") +
                   (why ? why : "not found") + ")"};
    }
    static nccl_api api;
    bool all = true;
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      all = all && fn != nullptr;
    };
    bind(api.get_version, "ncclGetVersion");
    bind(api.get_unique_id, "ncclGetUniqueId");
    bind(api.init_rank_config, "ncclCommInitRankConfig");
    bind(api.get_async_error, "ncclCommGetAsyncError");
    bind(api.all_reduce, "ncclAllReduce");
    bind(api.send, "ncclSend");
    bind(api.recv, "ncclRecv");
    bind(api.group_start, "ncclGroupStart");
    bind(api.group_end, "ncclGroupEnd");
    bind(api.abort, "ncclCommAbort");
    bind(api.error_string, "ncclGetErrorString");
    if (!all) return error{"libnccl.so.2 lacks calls troupe needs (NCCL 2.14 or later is required)"};
    return &api;
  }();
  return loaded;
}

const nccl_api& api() { return *load_nccl().value(); }

std::string nccl_message(const char* what, ncclResult_t r) {
  return std::string("NCCL ") + what + ": " + api().error_string(r);
}

}  // namespace

status nccl_usable() {
  auto loaded = load_nccl();
  if (!loaded) return loaded.err();
  return ok();
}

expected<std::shared_ptr<nccl_group>> nccl_group::create(int32_t size) {
  auto loaded = load_nccl();
  if (!loaded) return loaded.err();
  ncclUniqueId id;
  if (const ncclResult_t r = (*loaded)->get_unique_id(&id); r != ncclSuccess) return error{nccl_message("unique id", r)};
  nccl_unique_id out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return join(size, out);
}

expected<std::shared_ptr<nccl_group>> nccl_group::join(int32_t size, const nccl_unique_id& id) {
  if (size < 1) return error{"an NCCL group needs at least one rank"};
  if (auto loaded = load_nccl(); !loaded) return loaded.err();
  // The groups alive in this process, by id: every rank here shares one object.
  static std::mutex mutex;
  static std::map<std::array<char, 128>, std::weak_ptr<nccl_group>> live;
  std::lock_guard<std::mutex> lock(mutex);
  std::erase_if(live, [](const auto& entry) { return entry.second.expired(); });
  // (Its last holder may let go meanwhile, outside the lock: then it is gone.)
  if (auto it = live.find(id.bytes); it != live.end())
    if (auto group = it->second.lock()) {
      if (group->size() != size)
        return error{"this NCCL group has " + std::to_string(group->size()) + " ranks, not " + std::to_string(size)};
      return group;
    }
  auto group = std::shared_ptr<nccl_group>(new nccl_group(size, id));
  live[id.bytes] = group;
  return group;
}

struct nccl_member::impl {
  std::shared_ptr<nccl_group> group;
  int32_t rank = 0;
  ncclComm_t comm = nullptr;

  // Until the communicator's last operation has left the in-progress state (or, with a
  // deadline, until then); throws as check() does.
  void settle(const char* what, std::chrono::steady_clock::time_point deadline = {}) {
    using namespace std::chrono_literals;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = api().get_async_error(comm, &state);
      if (r != ncclSuccess) fail(nccl_message(what, r));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(nccl_message(what, state));
      if (group->aborted()) fail("");
      if (deadline != std::chrono::steady_clock::time_point{} && std::chrono::steady_clock::now() > deadline)
        fail(std::string(what) + ": the other ranks did not answer in time");
      std::this_thread::sleep_for(100us);
    }
  }

  // A call's outcome: in progress (settled), failed, or done.
  void finish(const char* what, ncclResult_t r) {
    if (r == ncclInProgress) return settle(what);
    if (r != ncclSuccess) fail(nccl_message(what, r));
  }

  // Aborts this rank's communicator and the group, and throws: why empty means the group
  // was aborted by someone else.
  [[noreturn]] void fail(const std::string& why) {
    group->abort();
    if (comm) api().abort(comm);
    comm = nullptr;
    throw collective_aborted{"NCCL rank " + std::to_string(rank) + ": " +
                             (why.empty() ? std::string("the group was aborted (a peer failed, or the group was ended)") : why)};
  }
};

nccl_member::nccl_member(std::shared_ptr<nccl_group> group, int32_t rank, int device,
                         std::chrono::milliseconds connect_timeout)
    : impl_(std::make_unique<impl>()) {
  TROUPE_ASSERT(group && rank >= 0 && rank < group->size(), rank);
  impl_->group = std::move(group);
  impl_->rank = rank;
  if (impl_->group->aborted()) throw collective_aborted{};
  if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed for cuda:" + std::to_string(device));
  ncclUniqueId id;
  std::memcpy(id.internal, impl_->group->id().bytes.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = api().init_rank_config(&impl_->comm, impl_->group->size(), id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    impl_->comm = nullptr;
    throw std::runtime_error(nccl_message("connecting", r));
  }
  const auto deadline = connect_timeout.count() > 0 ? std::chrono::steady_clock::now() + connect_timeout
                                                    : std::chrono::steady_clock::time_point{};
  impl_->settle("connecting", deadline);
}

nccl_member::~nccl_member() {
  // Nothing is in flight once the shard has waited for its stream; abort frees the
  // communicator without waiting on peers that may be gone (and ends any NCCL kernel
  // still waiting for one).
  if (impl_ && impl_->comm) api().abort(impl_->comm);
}

int32_t nccl_member::rank() const { return impl_->rank; }
const nccl_group& nccl_member::group() const { return *impl_->group; }

void nccl_member::all_reduce_sum(float* data, int64_t n, CUstream_st* stream) {
  if (!impl_->comm) throw collective_aborted{};
  impl_->finish("all-reduce", api().all_reduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, impl_->comm, stream));
}

void nccl_member::send_to_all(const float* data, int64_t n, CUstream_st* stream) {
  TROUPE_ASSERT(impl_->rank == 0, impl_->rank);
  if (!impl_->comm) throw collective_aborted{};
  // One NCCL group call: the sends to every rank go out together.
  impl_->finish("send", api().group_start());
  for (int32_t r = 1; r < impl_->group->size(); ++r) {
    const ncclResult_t q = api().send(data, static_cast<size_t>(n), ncclFloat32, r, impl_->comm, stream);
    if (q != ncclSuccess && q != ncclInProgress) {
      api().group_end();
      impl_->fail(nccl_message("send", q));
    }
  }
  impl_->finish("send", api().group_end());
}

void nccl_member::receive_from_first(float* data, int64_t n, CUstream_st* stream) {
  TROUPE_ASSERT(impl_->rank > 0, impl_->rank);
  if (!impl_->comm) throw collective_aborted{};
  impl_->finish("receive", api().recv(data, static_cast<size_t>(n), ncclFloat32, 0, impl_->comm, stream));
}

void nccl_member::check() {
  if (!impl_->comm) throw collective_aborted{};
  ncclResult_t state = ncclSuccess;
  api().get_async_error(impl_->comm, &state);
  if (state != ncclSuccess && state != ncclInProgress) impl_->fail(nccl_message("step", state));
  if (impl_->group->aborted()) impl_->fail("");
}

}  // namespace troupe

#else  // no NCCL headers in this build

namespace troupe {

namespace {
const char* const no_nccl =
    "NCCL (for tensor parallelism and device links on GPUs): this build of troupe has none (configure with CUDA where "
    "nccl.h is found)";
}

status nccl_usable() { return error{no_nccl}; }
expected<std::shared_ptr<nccl_group>> nccl_group::create(int32_t) { return error{no_nccl}; }
expected<std::shared_ptr<nccl_group>> nccl_group::join(int32_t, const nccl_unique_id&) { return error{no_nccl}; }

struct nccl_member::impl {};
nccl_member::nccl_member(std::shared_ptr<nccl_group>, int32_t, int, std::chrono::milliseconds) {
  throw std::runtime_error(no_nccl);
}
nccl_member::~nccl_member() = default;
int32_t nccl_member::rank() const { return 0; }
const nccl_group& nccl_member::group() const { throw std::runtime_error(no_nccl); }
void nccl_member::all_reduce_sum(float*, int64_t, CUstream_st*) { throw std::runtime_error(no_nccl); }
void nccl_member::send_to_all(const float*, int64_t, CUstream_st*) { throw std::runtime_error(no_nccl); }
void nccl_member::receive_from_first(float*, int64_t, CUstream_st*) { throw std::runtime_error(no_nccl); }
void nccl_member::check() { throw std::runtime_error(no_nccl); }

}  // namespace troupe

#endif
