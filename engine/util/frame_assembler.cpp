#include "engine/util/frame_assembler.hpp"

#include <algorithm>
#include <utility>

namespace troupe {

frame_assembler::frame_assembler(size_t header_bytes, body_fn body_of, size_t chunk)
    : header_bytes_(header_bytes), body_of_(std::move(body_of)), chunk_(std::max<size_t>(chunk, 1)) {
  TROUPE_ASSERT(header_bytes_ > 0);
}

size_t frame_assembler::wanted() const {
  if (!header_known_) return header_bytes_ - got_;
  // Room for as much again as arrived (at least a page, at most a chunk): a long frame
  // reads in ever larger pieces, a trickled one holds a page.
  const size_t step = std::min(chunk_, std::max(got_, min_step));
  return std::min(step, header_bytes_ + body_bytes_ - got_);
}

uint8_t* frame_assembler::space() {
  // The buffer holds what arrived plus one read: its growth follows the bytes, never the
  // length announced.
  const size_t need = got_ + wanted();
  if (buf_.size() < need) buf_.resize(need);
  return buf_.data() + got_;
}

status frame_assembler::took(size_t n) {
  TROUPE_ASSERT(n <= wanted(), n, wanted());
  got_ += n;
  if (!header_known_ && got_ == header_bytes_) {
    auto body = body_of_(header());
    if (!body) return body.err();
    body_bytes_ = *body;
    header_known_ = true;
  }
  return ok();
}

void frame_assembler::next() {
  got_ = body_bytes_ = 0;
  header_known_ = false;
  buf_.clear();
  if (buf_.capacity() > header_bytes_ + chunk_) {
    std::vector<uint8_t>().swap(buf_);  // a large frame's memory goes with it
  }
}

}  // namespace troupe
