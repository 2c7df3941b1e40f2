#include "actors/client/troupe_client.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async.h>

#include "actors/tls/kj_tls.hpp"
#include "actors/wire/client_codec.hpp"
#include "schema/client.capnp.h"

namespace troupe {

// The event loop of this thread, shared by its clients (KJ allows a thread one), for as
// long as one of them lives. (Not in an anonymous namespace: troupe_client::impl holds one.)
struct thread_io {
  kj::AsyncIoContext context = kj::setupAsyncIo();
};
static std::shared_ptr<thread_io> io_of_this_thread() {
  thread_local std::weak_ptr<thread_io> current;
  auto io = current.lock();
  if (!io) {
    io = std::make_shared<thread_io>();
    current = io;
  }
  return io;
}

// One gateway's connection: plain, or over TLS (made by hand: EzRpcClient takes no
// stream). Made when first used; errors surface from the first call.
struct gateway_link {
  gateway_link(thread_io& io, const std::string& a, const std::string& ca_file) : address(a) {
    const bool secure = a.rfind("capnps://", 0) == 0;
    const std::string where = secure ? a.substr(9) : a.rfind("capnp://", 0) == 0 ? a.substr(8) : a;
    const std::string host = host_of(where);
    kj::Promise<kj::Own<kj::AsyncIoStream>> stream =
        io.context.provider->getNetwork().parseAddress(where).then([](kj::Own<kj::NetworkAddress> addr) {
          return addr->connect().attach(kj::mv(addr));
        });
    if (secure) {
      auto ctx = tls::endpoint_context::client(ca_file);
      if (!ctx) {
        stream = kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(ctx.err().message.c_str()));
      } else {
        stream = stream.then([c = *ctx, host](kj::Own<kj::AsyncIoStream> s) mutable {
          return tls::connect_tls(*c, kj::mv(s), host).attach(kj::mv(c));
        });
      }
    }
    gateway = capnp::Capability::Client(stream.then([this](kj::Own<kj::AsyncIoStream> s) {
                connection = kj::mv(s);
                rpc = kj::heap<capnp::TwoPartyClient>(*connection);
                return rpc->bootstrap();
              })).castAs<schema::Gateway>();
  }
  // "host" of "host:port" or "[v6]:port".
  static std::string host_of(const std::string& where) {
    if (!where.empty() && where[0] == '[') return where.substr(1, where.find(']') - 1);
    return where.substr(0, where.rfind(':'));
  }

  std::string address;
  kj::Own<kj::AsyncIoStream> connection;
  kj::Own<capnp::TwoPartyClient> rpc;
  schema::Gateway::Client gateway = nullptr;
};

struct troupe_client::impl {
  impl(std::vector<std::string> a, std::string key, std::string ca)
      : io(io_of_this_thread()), addresses(std::move(a)), api_key(std::move(key)), ca_file(std::move(ca)) {}
  kj::WaitScope& wait_scope() { return io->context.waitScope; }

  // The gateway calls go to now (connected when first used).
  gateway_link& current() {
    if (!link) link = std::make_unique<gateway_link>(*io, addresses[at], ca_file);
    return *link;
  }
  // The current gateway has gone: the next one in the list takes the calls.
  void next() {
    link.reset();
    at = (at + 1) % addresses.size();
  }
  std::string address() const { return addresses[at]; }

  std::shared_ptr<thread_io> io;  // first: it goes last
  std::vector<std::string> addresses;
  size_t at = 0;
  std::unique_ptr<gateway_link> link;
  std::string api_key, ca_file;
};

namespace {

// One attempt's sink: its chunks are added to the result (numbered on from the chunks of
// earlier attempts, at other gateways), and its end fulfils `done`; a sink let go before
// its end (the gateway's connection lost) rejects it as a disconnection.
class sink_server final : public schema::TokenSink::Server {
 public:
  sink_server(client_result& r, const std::function<void(const client_chunk&)>& on_chunk,
              kj::Own<kj::PromiseFulfiller<void>> done)
      : r_(r), on_chunk_(on_chunk), done_(kj::mv(done)) {}
  ~sink_server() {
    if (done_->isWaiting())
      done_->reject(KJ_EXCEPTION(DISCONNECTED, "the gateway closed the connection before the request ended"));
  }

  kj::Promise<void> chunk(ChunkContext context) override {
    auto c = context.getParams().getChunk();
    client_chunk out;
    out.request = c.getRequestId();
    if (c.getSeq() != attempt_chunks_) r_.sequence_ok = false;
    ++attempt_chunks_;
    out.seq = r_.chunks;
    for (int32_t t : c.getTokens()) out.tokens.push_back(t);
    out.text.assign(c.getText().cStr(), c.getText().size());
    ++r_.chunks;
    r_.tokens.insert(r_.tokens.end(), out.tokens.begin(), out.tokens.end());
    r_.text += out.text;
    if (on_chunk_) on_chunk_(out);
    return kj::READY_NOW;
  }

  kj::Promise<void> done(DoneContext context) override {
    auto res = context.getParams().getResult();
    r_.request = res.getRequestId();
    switch (res.getReason()) {
      case schema::FinishReason::STOP: r_.reason = finish_reason::stop; break;
      case schema::FinishReason::LENGTH: r_.reason = finish_reason::length; break;
      case schema::FinishReason::ABORTED: r_.reason = finish_reason::aborted; break;
      default: r_.reason = finish_reason::none; break;
    }
    r_.prompt_tokens = res.getPromptTokens();
    r_.output_tokens = res.getOutputTokens();
    r_.error.assign(res.getError().cStr(), res.getError().size());
    if (res.getChunks() != attempt_chunks_) r_.sequence_ok = false;
    done_->fulfill();
    return kj::READY_NOW;
  }

 private:
  client_result& r_;
  const std::function<void(const client_chunk&)>& on_chunk_;
  kj::Own<kj::PromiseFulfiller<void>> done_;
  uint32_t attempt_chunks_ = 0;
};

// Whether a failed call should go to the next gateway: its connection lost or never made,
// or the gateway draining. (A refused key, a bad request, a full gateway are answers.)
bool try_another(const kj::Exception& e) {
  if (e.getType() == kj::Exception::Type::DISCONNECTED) return true;
  const std::string what = e.getDescription().cStr();
  return what.find("the gateway is draining") != std::string::npos || what.find("Connection refused") != std::string::npos;
}

// A failed call in words: the gateway at `address`, and what went wrong (the network's
// usual failures said plainly, anything else as KJ put it; a refused key with whether
// there was one to send).
std::string describe(const std::string& address, const std::string& api_key, const kj::Exception& e) {
  const std::string what = e.getDescription().cStr();
  std::string why = what;
  if (what.find("DNS lookup failed") != std::string::npos)
    why = "cannot resolve the host name";
  else if (what.find("Connection refused") != std::string::npos)
    why = "connection refused (no troupe node serves there?)";
  else if (what.find("[1347703881 < ") != std::string::npos)
    // Its answer began "HTTP" (read as a Cap'n Proto frame: that many segments, plus one).
    why = "it answers in HTTP: that is an HTTP endpoint, and this client speaks Cap'n Proto (use the address the "
          "node prints as endpoint: capnp://...)";
  else if (const size_t tls = what.find("TLS: "); tls != std::string::npos)
    why = "TLS: " + what.substr(tls + 5);  // the handshake's own words
  else if (e.getType() == kj::Exception::Type::DISCONNECTED)
    why = "the connection was lost (" + what + ")";
  else if (what.rfind("remote exception: ", 0) == 0)
    why = what.substr(18);  // the gateway's own words
  if (why.find("missing or wrong API key") != std::string::npos)
    why += api_key.empty() ? " (none was sent: set TROUPE_API_KEY to one of the gateway's keys)"
                           : " (the key sent is not among the gateway's keys)";
  return "troupe gateway at " + address + ": " + why;
}

}  // namespace

troupe_client::troupe_client(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
troupe_client::~troupe_client() = default;

std::unique_ptr<troupe_client> troupe_client::connect(const std::string& addresses, const std::string& api_key,
                                                      const std::string& ca_file) {
  std::string key = api_key, ca = ca_file;
  if (key.empty())
    if (const char* env = std::getenv("TROUPE_API_KEY")) key = env;
  if (ca.empty())
    if (const char* env = std::getenv("TROUPE_CA")) ca = env;
  std::vector<std::string> list;
  for (size_t from = 0; from <= addresses.size();) {
    size_t to = addresses.find(',', from);
    if (to == std::string::npos) to = addresses.size();
    std::string one = addresses.substr(from, to - from);
    while (!one.empty() && one.front() == ' ') one.erase(0, 1);
    while (!one.empty() && one.back() == ' ') one.pop_back();
    // A bare HOST:PORT after the first takes the first one's scheme (capnps://a,b: both TLS).
    if (!one.empty() && !list.empty() && one.find("://") == std::string::npos && list[0].rfind("capnps://", 0) == 0)
      one = "capnps://" + one;
    if (!one.empty()) list.push_back(one);
    from = to + 1;
  }
  if (list.empty()) list.push_back(addresses);
  return std::unique_ptr<troupe_client>(new troupe_client(std::make_unique<impl>(std::move(list), key, ca)));
}

size_t troupe_client::endpoints() const { return impl_->addresses.size(); }

// A call at the current gateway, then at each other one in turn while the gateway is lost
// (with one endpoint: once). What the last one tried said is the error.
template <class Call>
auto troupe_client::at_any(Call&& call) -> decltype(call(std::declval<gateway_link&>())) {
  const size_t n = impl_->addresses.size();
  std::string last;
  for (size_t tried = 0; tried < n; ++tried) {
    try {
      return call(impl_->current());
    } catch (const kj::Exception& e) {
      last = describe(impl_->address(), impl_->api_key, e);
      if (!try_another(e) || n == 1) return error{last};
      impl_->next();
    }
  }
  return error{last};
}

expected<client_result> troupe_client::generate(const std::string& prompt, const request_params& params,
                                                bool steps_include_prompt,
                                                const std::function<void(const client_chunk&)>& on_chunk) {
  client_result result;
  // A gateway lost mid-request: the request goes to the next one, with the tokens this
  // client has already been given (the router replays them, never streams them again), so
  // the caller sees each token once. Every gateway is given two chances.
  const size_t n = impl_->addresses.size();
  const size_t attempts = n == 1 ? 1 : 2 * n;
  std::string last;
  for (size_t attempt = 0; attempt < attempts; ++attempt) {
    if (attempt >= n) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a second round: a moment first
    try {
      auto& ws = impl_->wait_scope();
      auto paf = kj::newPromiseAndFulfiller<void>();
      auto req = impl_->current().gateway.generateRequest();
      auto r = req.initRequest();
      wire::fill_generate_request(r, prompt, params, steps_include_prompt);
      if (!result.tokens.empty()) {
        auto d = r.initDelivered(static_cast<unsigned>(result.tokens.size()));
        for (size_t i = 0; i < result.tokens.size(); ++i) d.set(static_cast<unsigned>(i), result.tokens[i]);
      }
      req.setApiKey(impl_->api_key);
      req.setSink(kj::heap<sink_server>(result, on_chunk, kj::mv(paf.fulfiller)));
      auto reply = req.send().wait(ws);
      result.request = reply.getRequestId();
      paf.promise.wait(ws);
      ++result.attempts;
      break;
    } catch (const kj::Exception& e) {
      ++result.attempts;
      last = describe(impl_->address(), impl_->api_key, e);
      if (!try_another(e) || attempts == 1) return error{last};
      impl_->next();
      if (attempt + 1 == attempts) return error{last + " (and every other gateway)"};
    }
  }
  if (result.reason == finish_reason::none) return error{result.error.empty() ? "request failed" : result.error};
  return result;
}

expected<bool> troupe_client::cancel(uint64_t request) {
  return at_any([&](gateway_link& l) -> expected<bool> {
    auto req = l.gateway.cancelRequest();
    req.setRequestId(request);
    req.setApiKey(impl_->api_key);
    return req.send().wait(impl_->wait_scope()).getFound();
  });
}

expected<client_health> troupe_client::health() {
  return at_any([&](gateway_link& l) -> expected<client_health> {
    // The response owns the message its reader points into: keep it while reading.
    auto response = l.gateway.healthRequest().send().wait(impl_->wait_scope());
    auto h = response.getHealth();
    return client_health{h.getReady(),         h.getDetail().cStr(), h.getReplicas(),
                         h.getReplicasReady(), h.getOutages(),       h.getLastDownMs()};
  });
}

expected<client_stats> troupe_client::stats() {
  return at_any([&](gateway_link& l) -> expected<client_stats> {
    auto req = l.gateway.statsRequest();
    req.setApiKey(impl_->api_key);
    auto response = req.send().wait(impl_->wait_scope());
    auto s = response.getStats();
    return client_stats{s.getRequestsRunning(), s.getRequestsWaiting(), s.getKvBlocksUsed(), s.getKvBlocksFree()};
  });
}

}  // namespace troupe
