// The Redis (or Valkey) tier, through hiredis: one connection, its calls serialized. A
// failed call closes the connection; the next call after a second tries to connect again,
// and until then every call fails at once (a store that is away must not slow steps down).
#include <chrono>
#include <cstring>
#include <mutex>

#include <hiredis/hiredis.h>

#include "engine/kv/kv_tiers.hpp"

namespace troupe {

namespace {

class redis_store final : public kv_tier_store {
 public:
  redis_store(std::string host, int port, int32_t timeout_ms) : host_(std::move(host)), port_(port), timeout_ms_(timeout_ms) {}
  ~redis_store() override { close(); }

  tier_kind kind() const override { return tier_kind::redis; }

  status put(const std::string& name, std::span<const std::byte> record) override {
    std::lock_guard lock(mu_);
    if (auto st = connect(); !st) return st;
    auto* r = static_cast<redisReply*>(
        redisCommand(ctx_, "SET %b %b", name.data(), name.size(), record.data(), record.size()));
    return check(r, [&](redisReply* rep) -> status {
      if (rep->type == REDIS_REPLY_ERROR) return error{"redis tier: SET: " + std::string(rep->str, rep->len)};
      return ok();
    });
  }

  expected<std::optional<std::vector<std::byte>>> get(const std::string& name) override {
    std::lock_guard lock(mu_);
    if (auto st = connect(); !st) return st.err();
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "GET %b", name.data(), name.size()));
    std::optional<std::vector<std::byte>> out;
    auto st = check(r, [&](redisReply* rep) -> status {
      if (rep->type == REDIS_REPLY_NIL) return ok();
      if (rep->type != REDIS_REPLY_STRING) return error{"redis tier: GET: an unexpected reply"};
      const auto* p = reinterpret_cast<const std::byte*>(rep->str);
      out.emplace(p, p + rep->len);
      return ok();
    });
    if (!st) return st.err();
    return out;
  }

  expected<size_t> leading_present(std::span<const std::string> names) override {
    std::lock_guard lock(mu_);
    if (auto st = connect(); !st) return st.err();
    for (const std::string& name : names)
      if (redisAppendCommand(ctx_, "EXISTS %b", name.data(), name.size()) != REDIS_OK) return fail();
    size_t n = 0;
    bool counting = true;
    for (size_t i = 0; i < names.size(); ++i) {
      void* reply = nullptr;
      if (redisGetReply(ctx_, &reply) != REDIS_OK || !reply) return fail();
      auto* r = static_cast<redisReply*>(reply);
      counting = counting && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
      n += counting;
      freeReplyObject(r);
    }
    return n;
  }

  void erase(const std::string& name) override {
    std::lock_guard lock(mu_);
    if (!connect()) return;
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "DEL %b", name.data(), name.size()));
    (void)check(r, [](redisReply*) -> status { return ok(); });
  }

 private:
  using clock = std::chrono::steady_clock;

  status connect() {
    if (ctx_) return ok();
    const auto now = clock::now();
    if (now < retry_at_) return error{"redis tier: " + host_ + ":" + std::to_string(port_) + " is unreachable (" + last_ + ")"};
    const timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
    ctx_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
    if (!ctx_ || ctx_->err) {
      last_ = ctx_ ? ctx_->errstr : "out of memory";
      close();
      retry_at_ = now + std::chrono::seconds(1);
      return error{"redis tier: cannot connect to " + host_ + ":" + std::to_string(port_) + ": " + last_};
    }
    redisSetTimeout(ctx_, tv);
    return ok();
  }

  template <class F>
  status check(redisReply* r, F&& look) {
    if (!r) return fail();
    status st = look(r);
    freeReplyObject(r);
    return st;
  }

  error fail() {
    last_ = ctx_ && ctx_->err ? ctx_->errstr : "no reply";
    close();
    retry_at_ = clock::now() + std::chrono::seconds(1);
    return error{"redis tier: " + last_};
  }

  void close() {
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
  }

  std::string host_;
  int port_;
  int32_t timeout_ms_;
  std::mutex mu_;
  redisContext* ctx_ = nullptr;
  clock::time_point retry_at_{};
  std::string last_;
};

}  // namespace

expected<std::unique_ptr<kv_tier_store>> make_redis_store(const std::string& address, int32_t timeout_ms) {
  tier_config c;
  c.kind = tier_kind::redis;
  c.address = address;
  c.timeout_ms = timeout_ms;
  if (auto e = validate(c)) return error{*e};
  const auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  // Not connected yet: a server that starts after the node is found at the first use.
  return std::unique_ptr<kv_tier_store>(std::make_unique<redis_store>(host, std::stoi(address.substr(colon + 1)), timeout_ms));
}

}  // namespace troupe
