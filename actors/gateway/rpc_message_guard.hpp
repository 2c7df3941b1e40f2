// rpc_message_guard: what a Cap'n Proto client sees when it breaks the protocol. Cap'n
// Proto's RPC system answers a message it cannot read (a frame that is not a message, a
// pointer of the wrong kind, an unknown question) with an Abort whose reason is the
// library's own assertion text ("expected segmentCount() < 512 [1819043177 < 512]; ...").
// Between the RPC system and a client's stream, this message stream logs that text (with
// the peer, rate-limited) and sends the client troupe's words instead; every other
// message passes untouched. Owned by its connection; the KJ thread only.
#pragma once

#include <string>

#include <capnp/serialize-async.h>
#include <kj/async-io.h>

#include "engine/util/rate_limited_log.hpp"

namespace troupe {

class guarded_message_stream final : public capnp::MessageStream {
 public:
  // `log` outlives the stream (the listener's); `peer` names the client in its lines.
  guarded_message_stream(kj::AsyncIoStream& stream, std::string peer, rate_limited_log& log);

  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(kj::ArrayPtr<kj::AutoCloseFd> fds,
                                                                     capnp::ReaderOptions options,
                                                                     kj::ArrayPtr<capnp::word> scratch) override;
  kj::Promise<void> writeMessage(kj::ArrayPtr<const int> fds,
                                 kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;
  kj::Promise<void> end() override;

  // The reason an Abort to a client gives: troupe's words for what went wrong.
  static constexpr const char* abort_reason =
      "troupe-capnp: the connection broke the Cap'n Proto RPC protocol (a message this gateway cannot read); closed";
  static constexpr const char* frame_reason =
      "troupe-capnp: the connection sent bytes that are not a Cap'n Proto message within this gateway's limits; closed";

 private:
  // An Abort in `segments`, as a message with troupe's reason (null: not an Abort).
  kj::Maybe<kj::Own<capnp::MallocMessageBuilder>> rewritten(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);

  capnp::AsyncIoMessageStream inner_;
  std::string peer_;
  rate_limited_log& log_;
  const char* why_ = abort_reason;  // the read side's finding, when it had one
};

}  // namespace troupe
