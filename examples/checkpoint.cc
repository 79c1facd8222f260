// examples/checkpoint.cc: see checkpoint.h.
#include "examples/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace collie::example {

namespace {

// The floats go to the file as the host holds them.
static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian");

constexpr char kMagic[8] = {'C', 'L', 'L', 'C', 'K', 'P', 'T', '1'};

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

void put_u64(Bytes& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Reads what encode() wrote; every read is checked against what is left.
class Reader {
 public:
  Reader(const Bytes& in, size_t end, std::string path)
      : in_(in), end_(end), path_(std::move(path)) {}

  uint64_t u64(const char* what) {
    need(8, what);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in_[at_ + i]) << (8 * i);
    at_ += 8;
    return v;
  }
  // A count of `size`-byte items that must fit in what is left.
  uint64_t count(const char* what, uint64_t size) {
    uint64_t n = u64(what);
    if (n > (end_ - at_) / size) truncated(what);
    return n;
  }
  void copy(void* to, size_t n, const char* what) {
    need(n, what);
    std::memcpy(to, in_.data() + at_, n);
    at_ += n;
  }
  size_t remaining() const { return end_ - at_; }

 private:
  void need(uint64_t n, const char* what) {
    if (n > end_ - at_) truncated(what);
  }
  [[noreturn]] void truncated(const char* what) {
    throw std::runtime_error("checkpoint " + path_ + " is truncated or damaged: it ends inside " +
                             what + "; delete it to start from step 0");
  }
  const Bytes& in_;
  size_t end_, at_ = 0;
  std::string path_;
};

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(errno_text("cannot write checkpoint", path));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Temporary file, fsync, rename over the old one, fsync of the folder (so
// the rename itself survives a crash of the machine): a reader sees the old
// checkpoint or the new one, whole.
void write_atomically(const std::string& path, const Bytes& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(errno_text("cannot create", tmp));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) throw std::runtime_error(errno_text("cannot fsync", tmp));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(errno_text("cannot rename " + tmp + " to", path));
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// Nothing when there is no file at all.
std::optional<Bytes> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw std::runtime_error(errno_text("cannot open checkpoint", path));
  }
  Bytes out;
  uint8_t chunk[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw std::runtime_error(errno_text("cannot read checkpoint", path));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  ::close(fd);
  return out;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s;
  for (uint64_t w : shape) s += (s.empty() ? "" : "-") + std::to_string(w);
  return s;
}

}  // namespace

Bytes encode(const Checkpoint& ck) {
  Bytes out(kMagic, kMagic + sizeof kMagic);
  put_u64(out, ck.step);
  put_u64(out, ck.rank_states.size());
  put_u64(out, ck.shape.size());
  for (uint64_t w : ck.shape) put_u64(out, w);
  put_u64(out, ck.params.size());
  const auto* p = reinterpret_cast<const uint8_t*>(ck.params.data());
  out.insert(out.end(), p, p + ck.params.size() * sizeof(float));
  for (const Bytes& st : ck.rank_states) {
    put_u64(out, st.size());
    out.insert(out.end(), st.begin(), st.end());
  }
  put_u64(out, fnv1a(out.data(), out.size()));
  return out;
}

Checkpoint decode(const Bytes& bytes, const std::string& path) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw std::runtime_error("checkpoint " + path +
                             " is not a train_mlp checkpoint (it does not start with " +
                             std::string(kMagic, sizeof kMagic) + ")");
  if (bytes.size() < sizeof kMagic + 8)
    throw std::runtime_error("checkpoint " + path +
                             " is truncated: " + std::to_string(bytes.size()) + " bytes");
  // The checksum first: a damaged length would otherwise be read as a size.
  const size_t end = bytes.size() - 8;
  uint64_t want = 0;
  for (int i = 0; i < 8; ++i) want |= static_cast<uint64_t>(bytes[end + i]) << (8 * i);
  if (fnv1a(bytes.data(), end) != want)
    throw std::runtime_error(
        "checkpoint " + path + " is damaged or truncated: its checksum does not match its " +
        std::to_string(bytes.size()) + " bytes; delete it to start from step 0");
  Reader r(bytes, end, path);
  Checkpoint ck;
  Bytes skip(sizeof kMagic);
  r.copy(skip.data(), skip.size(), "the magic");
  ck.step = r.u64("the step");
  uint64_t ranks = r.count("the rank count", 8);
  ck.shape.resize(r.count("the shape", 8));
  for (auto& w : ck.shape) w = r.u64("the shape");
  ck.params.resize(r.count("the parameters", sizeof(float)));
  r.copy(ck.params.data(), ck.params.size() * sizeof(float), "the parameters");
  ck.rank_states.resize(ranks);
  for (Bytes& st : ck.rank_states) {
    st.resize(r.count("a rank's reducer state", 1));
    r.copy(st.data(), st.size(), "a rank's reducer state");
  }
  if (r.remaining() != 0)
    throw std::runtime_error("checkpoint " + path + " has " + std::to_string(r.remaining()) +
                             " bytes after its last rank's state: it is not one this program "
                             "wrote");
  return ck;
}

void save(Communicator& comm, Reducer& reducer, uint64_t step, const std::vector<uint64_t>& shape,
          const std::vector<float>& params, const std::string& path) {
  const int n = comm.size();
  // Every rank's state to rank 0: the lengths, then the states padded to
  // the longest (all-gather takes one length from every rank).
  Bytes mine = reducer.save_state();
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  int64_t my_size = static_cast<int64_t>(mine.size());
  comm.allgather(view_of(&my_size, 1), view_of(sizes.data(), sizes.size())).wait();
  const size_t longest = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  mine.resize(longest);
  Bytes all(longest * static_cast<size_t>(n));
  if (longest > 0)
    comm.allgather(view_of(mine.data(), longest), view_of(all.data(), all.size())).wait();
  if (comm.rank() != 0) return;
  Checkpoint ck{step, shape, params, {}};
  for (int q = 0; q < n; ++q) {
    auto from = all.begin() + static_cast<long>(longest) * q;
    ck.rank_states.emplace_back(from, from + sizes[static_cast<size_t>(q)]);
  }
  write_atomically(path, encode(ck));
}

std::optional<Checkpoint> load(Communicator& comm, const std::string& path,
                               const std::vector<uint64_t>& shape) {
  // Rank 0 says first how many bytes follow: -1 none, -2 it could not read
  // them (and throws with the reason; the others say to look there).
  int64_t size = -1;
  Bytes bytes;
  std::string error;
  if (comm.rank() == 0) {
    try {
      if (auto b = read_file(path)) {
        bytes = std::move(*b);
        decode(bytes, path);
        size = static_cast<int64_t>(bytes.size());
      }
    } catch (const std::exception& e) {
      error = e.what();
      size = -2;
    }
  }
  comm.broadcast(view_of(&size, 1), 0).wait();
  if (size == -2)
    throw std::runtime_error(comm.rank() == 0
                                 ? error
                                 : "checkpoint " + path +
                                       " could not be loaded on rank 0 (its message says why)");
  if (size < 0) return std::nullopt;
  bytes.resize(static_cast<size_t>(size));
  comm.broadcast(view_of(bytes.data(), bytes.size()), 0).wait();
  Checkpoint ck = decode(bytes, path);
  if (ck.rank_states.size() != static_cast<size_t>(comm.size()))
    throw std::runtime_error("checkpoint " + path + " was saved by a job of " +
                             std::to_string(ck.rank_states.size()) + " ranks and this one has " +
                             std::to_string(comm.size()) +
                             ": each rank's reducer state (PowerSGD's error feedback) belongs to "
                             "its rank; resume with as many ranks, or delete it to start again");
  if (ck.shape != shape)
    throw std::runtime_error("checkpoint " + path + " holds a " + shape_text(ck.shape) +
                             " model and this one is " + shape_text(shape) +
                             " (another --hidden?); delete it to start again");
  return ck;
}

}  // namespace collie::example
