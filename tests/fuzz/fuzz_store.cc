// tests/fuzz/fuzz_store.cc: the TCP store's server side
// (comm/store/store_protocol.h), as up to four connections meet it.
//
// Input: a flags byte (how many connections, which secret), then commands,
// each a byte that names a connection and what to do on it:
//   raw bytes (a length and the bytes): anything at all;
//   a request (an op, any byte, and up to three fields drawn from a small
//     pool of keys, integers and values, sent as a well-formed record);
//   an honest client's handshake (hello, then the proof it computes from
//     the server's nonce), or its hello alone;
//   close the connection and open a new one.
// Contract, checked after every command:
// - every reply on every connection is a well-formed record of a known
//   status, and a refusal closes its connection;
// - a connection is authenticated only by the honest client's proof:
//   bytes from the input never forge one;
// - the keys change only by requests on authenticated connections, and a
//   connection that is not authenticated never makes the server buffer more
//   than one hello;
// - on the connections that took only well-formed requests, the replies
//   are exactly those of a reference model (a std::map and the parked
//   requests), including a get or wait answered when another connection
//   sets its keys, and a second request while one is parked dropping the
//   connection.
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/store_protocol.h"
#include "tests/fuzz/fuzz.h"

using namespace collie;
using namespace collie::store_detail;

namespace {

struct Reply {
  uint8_t status;
  std::vector<std::string> fields;
  bool operator==(const Reply&) const = default;
};

std::string show(const Reply& r) {
  std::string s = "status " + std::to_string(r.status) + " [";
  for (size_t i = 0; i < r.fields.size(); ++i)
    s += (i ? ", '" : "'") + r.fields[i].substr(0, 40) + "'";
  return s + "]";
}

// What the harness knows of one connection.
struct Conn {
  Session* s = nullptr;
  bool modelled = true;  // only well-formed requests and honest handshakes so far
  bool hello_sent = false;
  bool proved = false;  // the honest proof was accepted
  std::string client_nonce;
  uint8_t parked_op = 0;
  std::vector<std::string> parked;
  std::deque<Reply> expected;  // for a modelled connection
};

// Takes the records the server queued on `c` since the last call.
std::vector<Reply> replies(Conn& c) {
  Session& s = *c.s;
  std::vector<Reply> out;
  std::string_view q(s.out);
  q.remove_prefix(s.out_at);
  while (!q.empty()) {
    FUZZ_CHECK(q.size() >= 4, "a reply cut short");
    uint32_t len = get_u32(q.data());
    FUZZ_CHECK(len >= 1 && len <= q.size() - 4, "a reply whose length is not what follows");
    std::string_view rec = q.substr(4, len);
    Reply r{static_cast<uint8_t>(rec[0]), {}};
    FUZZ_CHECK(r.status <= kRefused, "a reply of unknown status " + std::to_string(r.status));
    FUZZ_CHECK(parse_fields(rec, r.fields), "a reply whose fields do not parse");
    FUZZ_CHECK(r.status != kRefused || s.closing, "a refusal that leaves the connection open");
    FUZZ_CHECK(r.status != kRefused || (r.fields.size() == 1 && !r.fields[0].empty()),
               "a refusal that does not say why");
    out.push_back(std::move(r));
    q.remove_prefix(4 + len);
  }
  s.out.clear();
  s.out_at = 0;
  return out;
}

const char* kPool[] = {"a",   "b", "rank/0", "", "1", "-9223372036854775808", "9223372036854775807",
                       "x y", "7"};

std::string field(fuzz::Input& in) {
  uint8_t b = in.byte();
  if (b < 200) return kPool[b % std::size(kPool)];
  std::string s;
  for (size_t n = b % 12; n > 0; --n) s += static_cast<char>(in.byte());
  return s;
}

// The counters' format: an optional minus and decimal digits, in range.
bool parse_int(const std::string& s, int64_t& v) {
  size_t i = !s.empty() && s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  __int128 x = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    x = x * 10 + (s[i] - '0');
    if (x > (static_cast<__int128>(1) << 64)) return false;
  }
  if (s[0] == '-') x = -x;
  if (x > INT64_MAX || x < INT64_MIN) return false;
  v = static_cast<int64_t>(x);
  return true;
}

class Harness {
 public:
  Harness(StoreAuth auth, int conns) : proto_(auth, [this] { return next_nonce(); }), auth_(auth) {
    for (int i = 0; i < conns; ++i) conns_.push_back(open());
  }
  ~Harness() {
    for (auto& c : conns_) proto_.close(c.s);
  }

  void step(fuzz::Input& in) {
    const uint8_t cmd = in.byte();
    Conn& c = conns_[cmd % conns_.size()];
    const auto before = proto_.data();
    const bool was_authed = c.s->authed;
    switch ((cmd >> 2) % 5) {
      case 0: {  // raw bytes
        size_t n = in.byte() | (size_t{in.byte() & 7u} << 8);
        std::string bytes;
        for (size_t i = 0; i < n && !in.empty(); ++i) bytes += static_cast<char>(in.byte());
        c.modelled = false;
        proto_.receive(*c.s, bytes);
        // Whatever the bytes did to the keys, the model follows the server
        // from here; the connections still modelled may have had their
        // parked requests answered by them.
        resync();
        break;
      }
      case 1:
        request(c, in);
        break;
      case 2:
        handshake(c, true);
        break;
      case 3:
        handshake(c, false);
        break;
      case 4:
        proto_.close(c.s);
        c = open();
        break;
    }
    FUZZ_CHECK(was_authed || proto_.data() == before,
               "a connection that is not authenticated changed the keys");
    check_all();
  }

 private:
  auth::Nonce next_nonce() {
    auth::Nonce n{};
    n[0] = static_cast<uint8_t>(++nonces_);
    n[1] = 0x5a;
    return n;
  }

  Conn open() {
    Conn c;
    c.s = proto_.open();
    return c;
  }

  void expect(Conn& c, Reply r) {
    if (c.modelled) c.expected.push_back(std::move(r));
  }

  // The server drops `c` in silence; the model says so.
  void expect_drop(Conn& c) {
    if (!c.modelled) return;
    FUZZ_CHECK(c.s->dropped, "a connection that should have been dropped was not");
    c.parked_op = 0;
    c.parked.clear();
  }

  // After bytes the model did not follow changed what they changed: the
  // model takes the server's keys, and a parked request they answered (by a
  // set, perhaps undone by a delete before the model could see it) leaves
  // the model.
  void resync() {
    model_ = proto_.data();
    for (auto& o : conns_)
      if (o.modelled && o.parked_op && o.s->parked_op == 0) o.modelled = false;
    wake_parked();
  }

  void wake_parked() {
    for (auto& o : conns_) {
      if (!o.modelled || !o.parked_op) continue;
      bool ready = true;
      for (auto& k : o.parked) ready = ready && model_.count(k);
      if (!ready) continue;
      expect(o, o.parked_op == kGet ? Reply{kOk, {model_[o.parked[0]]}} : Reply{kOk, {}});
      o.parked_op = 0;
      o.parked.clear();
    }
  }

  void request(Conn& c, fuzz::Input& in) {
    const uint8_t op = in.byte() % 12;
    std::vector<std::string> f;
    for (int n = in.byte() % 4; n > 0; --n) f.push_back(field(in));
    const bool gone = c.s->dropped || c.s->closing;
    proto_.receive(*c.s, message(op, {f.begin(), f.end()}));
    if (gone) return;
    if (!c.modelled) return resync();
    if (!c.proved) {
      // Before the handshake, a request of any other kind is dropped; a
      // hello is judged by the server (its nonce is not the honest one's),
      // and the model stops following this connection.
      if (op != kHello || c.hello_sent) {
        expect_drop(c);
      } else {
        c.modelled = false;
      }
      return;
    }
    if (c.parked_op) return expect_drop(c);
    model(c, op, f);
  }

  // The reference: what a store does with one well-formed request.
  void model(Conn& c, uint8_t op, std::vector<std::string>& f) {
    auto fails = [&] { expect(c, Reply{kFailed, {"*"}}); };
    switch (op) {
      case kSet:
        if (f.size() != 2) return fails();
        model_[f[0]] = f[1];
        expect(c, Reply{kOk, {}});
        return wake_parked();
      case kGet:
      case kWait:
        if (f.empty() || (op == kGet && f.size() != 1)) return fails();
        c.parked_op = op;
        c.parked = f;
        return wake_parked();
      case kAdd: {
        int64_t cur = 0, delta = 0;
        if (f.size() != 2 || !parse_int(f[1], delta)) return fails();
        auto it = model_.find(f[0]);
        if (it != model_.end() && !parse_int(it->second, cur)) return fails();
        __int128 sum = static_cast<__int128>(cur) + delta;
        if (sum > INT64_MAX || sum < INT64_MIN) return fails();
        model_[f[0]] = std::to_string(static_cast<int64_t>(sum));
        expect(c, Reply{kOk, {model_[f[0]]}});
        return wake_parked();
      }
      case kCompareSet: {
        if (f.size() != 3) return fails();
        auto it = model_.find(f[0]);
        bool match = it == model_.end() ? f[1].empty() : it->second == f[1];
        if (!match) return expect(c, Reply{kOk, {it == model_.end() ? "" : it->second}});
        model_[f[0]] = f[2];
        expect(c, Reply{kOk, {f[2]}});
        return wake_parked();
      }
      case kDelete:
        if (f.size() != 1) return fails();
        expect(c, Reply{kOk, {model_.erase(f[0]) ? "1" : "0"}});
        return;
      case kCheck: {
        std::vector<std::string> missing;
        for (auto& k : f)
          if (!model_.count(k)) missing.push_back(k);
        return expect(c, Reply{kOk, missing});
      }
      default:
        return fails();
    }
  }

  // An honest client: hello with this job and a fresh nonce; with `prove`,
  // checks the server's MAC and sends its own proof.
  void handshake(Conn& c, bool prove) {
    const bool gone = c.s->dropped || c.s->closing;
    if (c.proved || c.hello_sent || gone || !c.modelled) {
      // Not where an honest client says hello: only the invariants apply.
      c.modelled = false;
      proto_.receive(*c.s, message(kHello, {kMagic, auth_.job, std::string(32, 'h')}));
      return;
    }
    c.client_nonce = std::string(32, static_cast<char>('A' + (++hellos_ % 26)));
    proto_.receive(*c.s, message(kHello, {kMagic, auth_.job, c.client_nonce}));
    c.hello_sent = true;
    auto r = replies(c);
    FUZZ_CHECK(r.size() == 1 && r[0].status == kOk && r[0].fields.size() == 2 &&
                   r[0].fields[0].size() == auth::kNonceBytes,
               "an honest hello was not answered with a nonce and a MAC");
    const std::string& sn = r[0].fields[0];
    FUZZ_CHECK(auth::same(server_mac(auth_.secret, auth_.job, c.client_nonce, sn), r[0].fields[1]),
               "the server's proof does not verify");
    if (!prove) {
      c.modelled = false;  // what comes next on it is the input's
      return;
    }
    proto_.receive(
        *c.s, message(kProof, {mac_view(client_mac(auth_.secret, auth_.job, c.client_nonce, sn))}));
    FUZZ_CHECK(c.s->authed, "an honest proof was not accepted");
    c.proved = true;
    expect(c, Reply{kOk, {}});
  }

  void check_all() {
    for (auto& c : conns_) {
      const Session& s = *c.s;
      FUZZ_CHECK(!s.authed || c.proved, "a connection was authenticated without the proof");
      FUZZ_CHECK(s.authed || s.in.size() <= 4 + kMaxHello,
                 "a connection that is not authenticated made the server buffer " +
                     std::to_string(s.in.size()) + " bytes");
      auto got = replies(c);
      if (!c.modelled) continue;
      FUZZ_CHECK(got.size() == c.expected.size(),
                 std::to_string(got.size()) + " replies where the model expects " +
                     std::to_string(c.expected.size()) +
                     (got.empty() ? "" : "; the first: " + show(got[0])));
      for (size_t i = 0; i < got.size(); ++i) {
        const Reply& want = c.expected[i];
        if (want.status == kFailed && want.fields == std::vector<std::string>{"*"}) {
          FUZZ_CHECK(
              got[i].status == kFailed && got[i].fields.size() == 1 && !got[i].fields[0].empty(),
              "a request the model refuses got " + show(got[i]));
        } else {
          FUZZ_CHECK(got[i] == want, "got " + show(got[i]) + " where the model says " + show(want));
        }
      }
      c.expected.clear();
    }
  }

  ServerProtocol proto_;
  const StoreAuth auth_;
  std::vector<Conn> conns_;
  std::map<std::string, std::string> model_;
  int nonces_ = 0;
  int hellos_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.byte();
  StoreAuth auth{(flags & 4) ? "" : "the job's secret", "job 17, 4 ranks"};
  Harness h(auth, 1 + (flags & 3));
  for (int steps = 0; !in.empty() && steps < 256; ++steps) h.step(in);
  return 0;
}
