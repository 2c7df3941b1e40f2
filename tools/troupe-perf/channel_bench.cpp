#include "tools/troupe-perf/channel_bench.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv/kv_channel.hpp"
#include "engine/util/tcp.hpp"
#include "tools/common/stats.hpp"

namespace troupe::tools {

namespace {

using clock_type = std::chrono::steady_clock;

// The channel: records of block_kib each, sent until total_mib have landed.
double channel_once(const channel_bench_options& o, const std::vector<std::byte>& block) {
  std::atomic<size_t> landed{0};
  auto r = kv_channel_receiver::start("127.0.0.1", 0, [&](std::string_view, std::span<const std::byte> p) {
    landed += p.size();
  });
  if (!r) throw std::runtime_error(r.err().message);
  auto s = kv_channel_sender::connect("127.0.0.1", (*r)->port());
  if (!s) throw std::runtime_error(s.err().message);
  const size_t blocks = (o.total_mib << 20) / block.size();
  const auto t0 = clock_type::now();
  for (size_t i = 0; i < blocks; ++i) {
    std::string name = "b";  // (appended: "b" + to_string() trips g++ 12's -Wrestrict)
    name += std::to_string(i);
    if (auto sent = (*s)->send(name, block); !sent) throw std::runtime_error(sent.err().message);
  }
  if (!(*s)->flush(std::chrono::minutes(5))) throw std::runtime_error("the channel did not drain: " + (*s)->broken());
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  return static_cast<double>(landed.load()) / secs / 1e9;
}

// Raw TCP: the same bytes in the same pieces, read whole on the other side.
double raw_once(const channel_bench_options& o, const std::vector<std::byte>& block) {
  auto l = tcp::listen_on("127.0.0.1", 0, "raw", 1);
  if (!l) throw std::runtime_error(l.err().message);
  const size_t blocks = (o.total_mib << 20) / block.size();
  size_t got = 0;
  std::thread reader([&] {
    const int c = ::accept(l->fd, nullptr, nullptr);
    std::vector<std::byte> buf(block.size());
    for (size_t i = 0; i < blocks && tcp::read_exact(c, buf.data(), buf.size()); ++i) got += buf.size();
    ::close(c);
  });
  auto fd = tcp::connect_to("127.0.0.1", l->port, 2000, "raw");
  if (!fd) throw std::runtime_error(fd.err().message);
  const auto t0 = clock_type::now();
  for (size_t i = 0; i < blocks; ++i) tcp::write_all(*fd, {{block.data(), block.size()}});
  reader.join();
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  ::close(*fd);
  ::close(l->fd);
  return static_cast<double>(got) / secs / 1e9;
}

}  // namespace

channel_bench_result measure_channel(const channel_bench_options& o, int runs) {
  std::vector<std::byte> block(o.block_kib << 10);
  for (size_t i = 0; i < block.size(); ++i) block[i] = std::byte(static_cast<uint8_t>(i * 131 + 7));
  std::vector<double> channel, raw;
  for (int i = 0; i < runs; ++i) {
    raw.push_back(raw_once(o, block));
    channel.push_back(channel_once(o, block));
    std::fprintf(stderr, "troupe-perf: run %d of %d: raw TCP %.2f GB/s, kv channel %.2f GB/s\n", i + 1, runs, raw.back(),
                 channel.back());
  }
  return {median(channel), median(raw)};
}

}  // namespace troupe::tools
