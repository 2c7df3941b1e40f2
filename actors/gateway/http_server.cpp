#include "actors/gateway/http_server_parts.hpp"

namespace troupe::http {

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

namespace {

template <class Fields>
std::string find_header(const Fields& fields, std::string_view name) {
  for (const auto& f : fields)
    if (same_name(f.name, name)) return f.value;
  return {};
}

}  // namespace

std::string request::header(std::string_view name) const { return find_header(headers, name); }

bool request::has(std::string_view name) const {
  for (const auto& f : headers)
    if (same_name(f.name, name)) return true;
  return false;
}

void response::set(std::string_view name, std::string value) {
  for (auto& f : headers)
    if (same_name(f.name, name)) {
      f.value = std::move(value);
      return;
    }
  headers.push_back({std::string(name), std::move(value)});
}

std::string response::header(std::string_view name) const { return find_header(headers, name); }

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

std::string head_text(const response& r, unsigned version, const std::string& framing, bool close, bool keep_alive_10) {
  std::string h = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  h += std::to_string(r.status);
  h += ' ';
  h += reason_phrase(r.status);
  h += "\r\n";
  for (const auto& f : r.headers) {
    if (same_name(f.name, "Content-Length") || same_name(f.name, "Transfer-Encoding") || same_name(f.name, "Connection"))
      continue;
    h += f.name;
    h += ": ";
    h += f.value;
    h += "\r\n";
  }
  h += framing;
  if (close)
    h += "Connection: close\r\n";
  else if (keep_alive_10)
    h += "Connection: keep-alive\r\n";
  h += "\r\n";
  return h;
}

const std::string continue_line = "HTTP/1.1 100 Continue\r\n\r\n";

response default_error_page(int status, const std::string& message, const std::string&) {
  response r;
  r.status = status;
  r.set("Content-Type", "text/plain; charset=utf-8");
  r.body = message + "\n";
  return r;
}

void server::impl::accept() {
  acceptor.async_accept([self = shared_from_this()](const boost::system::error_code& ec, tcp::socket s) {
    if (!self->accepting) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors, or the like: a moment's pause, then on.
      auto t = std::make_shared<asio::steady_timer>(self->io, std::chrono::milliseconds(50));
      if (ec == asio::error::no_descriptors || ec == asio::error::no_memory) self->make_room();
      t->async_wait([self, t](const boost::system::error_code&) { self->accept(); });
      return;
    }
    self->admit(std::move(s));
    self->accept();
  });
}

void server::impl::admit(tcp::socket s) {
  if (draining) return;
  // (The one making room closes once its 408 is written: until then both are held.)
  if (conns.size() >= cfg.max_connections && !make_room()) return;  // every connection busy: this one is closed
  auto c = std::make_shared<connection>(*this, std::move(s));
  conns.emplace(c.get(), c);
  ++open;
  ++accepted;
  if (cfg.on_connection) cfg.on_connection(+1);
  c->start();
}

bool server::impl::make_room() {
  if (waiting.empty()) return false;
  connection* c = waiting.front();
  waiting.pop_front();
  c->in_waiting = false;
  ++shed;
  ++unreported_shed;
  if (cfg.on_connection) cfg.on_connection(0);
  report();
  c->cut_off();
  return true;
}

void server::impl::report(bool force) {
  const auto now = clock_type::now();
  if (unreported_late + unreported_shed + unreported_tls == 0) return;
  if (!force && now - last_report < std::chrono::seconds(10)) return;
  last_report = now;
  if (!cfg.log) {
    unreported_late = unreported_shed = unreported_tls = 0;
    return;
  }
  if (unreported_late + unreported_shed > 0) {
    std::string line = "closed ";
    if (unreported_late > 0)
      line += std::to_string(unreported_late) + " connection(s) that had not sent a whole request within " +
              std::to_string(cfg.read_timeout.count()) + " ms";
    if (unreported_late > 0 && unreported_shed > 0) line += ", and ";
    if (unreported_shed > 0)
      line += std::to_string(unreported_shed) +
              " waiting for their request to make room for new ones (max_connections reached)";
    line += " (answered 408)";
    if (!first_late.empty()) line += "; one from " + first_late.substr(0, first_late.rfind(':'));
    cfg.log(line);
  }
  if (unreported_tls > 0)
    cfg.log("refused " + std::to_string(unreported_tls) + " TLS handshake(s): " + first_tls_reason);
  unreported_late = unreported_shed = unreported_tls = 0;
  first_late.clear();
  first_tls_reason.clear();
}

server::server(server_config cfg, handler h) : impl_(std::make_shared<impl>(std::move(cfg), std::move(h))) {}

server::~server() { stop(std::chrono::milliseconds(0)); }

expected<uint16_t> server::start() {
  impl& s = *impl_;
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(s.cfg.host == "localhost" ? "127.0.0.1" : s.cfg.host, ec);
  if (ec) return error{"http: cannot listen on " + s.cfg.host + ": not an IP address"};
  const tcp::endpoint ep(addr, s.cfg.port);
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(SOMAXCONN, ec);
  if (ec) return error{"http: cannot listen on " + s.cfg.host + ":" + std::to_string(s.cfg.port) + ": " + ec.message()};
  if (s.cfg.tls) {
    SSL_CTX_up_ref(s.cfg.tls);
    s.ssl.emplace(s.cfg.tls);
  }
  s.workers = std::make_unique<worker_pool>(s.cfg.handler_threads);
  s.accept();
  auto done = std::make_shared<std::promise<void>>();
  s.io_done = done->get_future().share();
  s.io_thread = std::thread([p = impl_, done] {
    pthread_setname_np(pthread_self(), "http-io");
    p->io.run();
    done->set_value();
  });
  return s.acceptor.local_endpoint().port();
}

void server::stop(std::chrono::milliseconds drain) {
  impl& s = *impl_;
  if (!s.io_thread.joinable()) return;
  // Stop accepting; close connections waiting for a request; the rest close after their
  // answers.
  asio::post(s.io, [p = impl_] {
    p->accepting = false;
    p->draining = true;
    boost::system::error_code ec;
    p->acceptor.close(ec);
    std::vector<std::shared_ptr<connection>> all;
    for (auto& [_, c] : p->conns) all.push_back(c);
    for (auto& c : all) c->drain();
  });
  const auto until = clock_type::now() + drain;
  while (clock_type::now() < until) {
    auto left = std::make_shared<std::promise<size_t>>();
    auto f = left->get_future();
    asio::post(s.io, [p = impl_, left] { left->set_value(p->conns.size()); });
    if (f.wait_for(std::chrono::seconds(1)) == std::future_status::ready && f.get() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The rest are closed; with nothing left to wait for, the I/O thread's run() returns once
  // every handler has run (and let go of what it held: the server among them).
  asio::post(s.io, [p = impl_] {
    std::vector<std::shared_ptr<connection>> all;
    for (auto& [_, c] : p->conns) all.push_back(c);
    for (auto& c : all) c->close();
    p->report(true);
    p->keep_running.reset();
  });
  if (s.io_done.wait_for(std::chrono::seconds(2)) != std::future_status::ready) s.io.stop();  // (never seen)
  s.io_thread.join();
  s.workers->stop();
}

server_stats server::stats() const {
  const impl& s = *impl_;
  server_stats st;
  st.open = s.open.load();
  st.streaming = s.streaming.load();
  st.accepted = s.accepted.load();
  st.timed_out = s.timed_out.load();
  st.shed = s.shed.load();
  st.slow_readers = s.slow_readers.load();
  st.half_closed = s.half_closed.load();
  st.refused_tls = s.refused_tls.load();
  st.threads = 1 + (s.workers ? s.workers->size() : 0);
  return st;
}

}  // namespace troupe::http
