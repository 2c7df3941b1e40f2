#include "actors/gateway/rpc_message_guard.hpp"

#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>

namespace troupe {

guarded_message_stream::guarded_message_stream(kj::AsyncIoStream& stream, std::string peer, rate_limited_log& log)
    : inner_(stream), peer_(std::move(peer)), log_(log) {}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> guarded_message_stream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd> fds, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word> scratch) {
  return inner_.tryReadMessage(fds, options, scratch)
      .catch_([this](kj::Exception&& e) -> kj::Maybe<capnp::MessageReaderAndFds> {
        if (e.getType() == kj::Exception::Type::DISCONNECTED) throw kj::mv(e);  // it went away: nothing to say
        log_("troupe-capnp: " + peer_ + ": closed: a frame the library refused: " + std::string(e.getDescription().cStr()));
        why_ = frame_reason;
        throw kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::heapString(frame_reason));
      });
}

kj::Maybe<kj::Own<capnp::MallocMessageBuilder>> guarded_message_stream::rewritten(
    kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  try {
    capnp::SegmentArrayMessageReader reader(segments);
    const auto message = reader.getRoot<capnp::rpc::Message>();
    if (!message.isAbort()) return nullptr;
    const auto abort = message.getAbort();
    const std::string reason = abort.hasReason() ? std::string(abort.getReason().cStr()) : std::string();
    if (reason != frame_reason) log_("troupe-capnp: " + peer_ + ": closed: " + reason);
    auto out = kj::heap<capnp::MallocMessageBuilder>();
    auto replaced = out->initRoot<capnp::rpc::Message>().initAbort();
    replaced.setType(abort.getType());
    replaced.setReason(why_);
    return kj::mv(out);
  } catch (const kj::Exception&) {
    return nullptr;  // (the RPC system's own messages always read)
  }
}

kj::Promise<void> guarded_message_stream::writeMessage(kj::ArrayPtr<const int> fds,
                                                       kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  KJ_IF_MAYBE(b, rewritten(segments)) {
    const auto out = (*b)->getSegmentsForOutput();
    return inner_.writeMessage(fds, out).attach(kj::mv(*b));
  }
  return inner_.writeMessage(fds, segments);
}

kj::Promise<void> guarded_message_stream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  // An Abort is the last message a connection sends: written on its own, in order.
  for (size_t i = 0; i < messages.size(); ++i) {
    KJ_IF_MAYBE(b, rewritten(messages[i])) {
      const auto out = (*b)->getSegmentsForOutput();
      auto before = inner_.writeMessages(messages.slice(0, i));
      return before.then([this, out]() { return inner_.writeMessage(nullptr, out); }).attach(kj::mv(*b));
    }
  }
  return inner_.writeMessages(messages);
}

kj::Maybe<int> guarded_message_stream::getSendBufferSize() { return inner_.getSendBufferSize(); }

kj::Promise<void> guarded_message_stream::end() { return inner_.end(); }

}  // namespace troupe
