// comm/store/store_protocol.cc: the TCP store's records and the server's
// side of the protocol (comm/store/store_protocol.h).
#include "comm/store/store_protocol.h"

#include <algorithm>

#include "comm/store/parse_int.h"

namespace collie::store_detail {

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(const char* c) {
  auto p = reinterpret_cast<const uint8_t*>(c);
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

std::string message(uint8_t head, const std::vector<std::string_view>& fields) {
  size_t len = 1;
  for (auto f : fields) len += 4 + f.size();
  std::string msg;
  msg.reserve(4 + len);
  put_u32(msg, static_cast<uint32_t>(len));
  msg.push_back(static_cast<char>(head));
  for (auto f : fields) {
    put_u32(msg, static_cast<uint32_t>(f.size()));
    msg.append(f);
  }
  return msg;
}

bool parse_fields(std::string_view rec, std::vector<std::string>& out) {
  out.clear();
  size_t at = 1;
  while (at < rec.size()) {
    if (rec.size() - at < 4) return false;
    uint32_t len = get_u32(rec.data() + at);
    at += 4;
    if (len > rec.size() - at) return false;
    out.emplace_back(rec.substr(at, len));
    at += len;
  }
  return true;
}

auth::Mac server_mac(const std::string& secret, std::string_view job, std::string_view client_nonce,
                     std::string_view server_nonce) {
  return auth::mac(secret, {kMagic, "server", job, client_nonce, server_nonce});
}

auth::Mac client_mac(const std::string& secret, std::string_view job, std::string_view client_nonce,
                     std::string_view server_nonce) {
  return auth::mac(secret, {kMagic, "client", job, client_nonce, server_nonce});
}

std::string list_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " in all)";
  return s;
}

namespace {

bool keys_ok(const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(), [](auto& k) { return k.size() <= kMaxKey; });
}

}  // namespace

Session* ServerProtocol::open() {
  return &sessions_.emplace_back();
}

void ServerProtocol::close(Session* s) {
  sessions_.remove_if([s](const Session& x) { return &x == s; });
}

bool ServerProtocol::receive(Session& s, std::string_view bytes) {
  if (s.dropped || s.closing) return false;
  s.in.append(bytes);
  for (;;) {
    if (s.in.size() < 4) return true;
    uint32_t len = get_u32(s.in.data());
    // The cap is checked on the declared length, before buffering any of
    // the record, so a garbage length costs nothing.
    if (len == 0 || len > (s.authed ? kMaxRecord : kMaxHello)) return drop(s);
    if (s.in.size() - 4 < len) return true;
    std::string rec = s.in.substr(4, len);
    s.in.erase(0, 4 + size_t{len});
    if (!handle(s, rec)) return false;
  }
}

bool ServerProtocol::drop(Session& s) {
  s.dropped = true;
  s.in.clear();
  s.parked.clear();
  s.parked_op = 0;
  return false;
}

bool ServerProtocol::handle(Session& s, std::string& rec) {
  const uint8_t op = static_cast<uint8_t>(rec[0]);
  std::vector<std::string> f;
  if (!parse_fields(rec, f)) return drop(s);
  if (!s.authed) return handshake(s, op, f);
  // A client sends one request at a time; anything else is not ours.
  if (s.parked_op != 0) return drop(s);
  switch (op) {
    case kSet:
      if (f.size() != 2 || f[0].size() > kMaxKey || f[1].size() > kMaxValue)
        return fail(s, "malformed set");
      data_[f[0]] = std::move(f[1]);
      s.out += message(kOk, {});
      wake_parked();
      return true;
    case kGet:
    case kWait:
      if (f.empty() || (op == kGet && f.size() != 1) || !keys_ok(f))
        return fail(s, "malformed get/wait");
      s.parked_op = op;
      s.parked = std::move(f);
      answer_if_ready(s);
      return true;
    case kAdd: {
      int64_t cur = 0, delta = 0, sum = 0;
      if (f.size() != 2 || f[0].size() > kMaxKey || !parse_i64(f[1], delta))
        return fail(s, "malformed add");
      auto it = data_.find(f[0]);
      if (it != data_.end() && !parse_i64(it->second, cur))
        return fail(s, "add: the value under '" + f[0] + "' is not an integer");
      if (__builtin_add_overflow(cur, delta, &sum))
        return fail(s, "add: the value under '" + f[0] + "' would overflow int64");
      std::string v = std::to_string(sum);
      data_[f[0]] = v;
      s.out += message(kOk, {v});
      wake_parked();
      return true;
    }
    case kCompareSet: {
      if (f.size() != 3 || f[0].size() > kMaxKey || f[2].size() > kMaxValue)
        return fail(s, "malformed compare_set");
      auto it = data_.find(f[0]);
      bool match = it == data_.end() ? f[1].empty() : it->second == f[1];
      if (!match) {
        s.out += message(kOk, {it == data_.end() ? std::string_view() : it->second});
        return true;
      }
      s.out += message(kOk, {f[2]});
      data_[f[0]] = std::move(f[2]);
      wake_parked();
      return true;
    }
    case kDelete: {
      if (f.size() != 1 || !keys_ok(f)) return fail(s, "malformed delete");
      bool existed = data_.erase(f[0]) > 0;
      s.out += message(kOk, {existed ? "1" : "0"});
      return true;
    }
    case kCheck: {
      if (!keys_ok(f)) return fail(s, "malformed check");
      std::vector<std::string_view> missing;
      for (auto& k : f)
        if (!data_.count(k)) missing.push_back(k);
      s.out += message(kOk, missing);
      return true;
    }
    default:
      return fail(s, "unknown request " + std::to_string(op));
  }
}

// Hello, then proof. Anything that is not a collie client of this version
// is dropped without a word; a collie client of another job or without the
// secret is told why (and the server logs it with the address).
bool ServerProtocol::handshake(Session& s, uint8_t op, const std::vector<std::string>& f) {
  if (s.client_nonce.empty()) {
    if (op != kHello || f.size() != 3 || f[0] != kMagic || f[2].size() != auth::kNonceBytes)
      return drop(s);
    if (f[1] != auth_.job)
      return refuse(s, "this store serves job '" + auth_.job + "' and the client is of job '" +
                           f[1].substr(0, 300) +
                           "' (a rank of another job pointed at this store's port?)");
    s.client_nonce = f[2];
    s.server_nonce = nonce_();
    std::string_view sn = auth::view(s.server_nonce);
    s.out += message(kOk, {sn, mac_view(server_mac(auth_.secret, auth_.job, f[2], sn))});
    return true;
  }
  if (op != kProof || f.size() != 1) return drop(s);
  if (!auth::same(client_mac(auth_.secret, auth_.job, s.client_nonce, auth::view(s.server_nonce)),
                  f[0]))
    return refuse(s, "the job secret does not match");
  s.authed = true;
  s.out += message(kOk, {});
  return true;
}

// Says why before closing, so that the client can tell a refusal from a
// crash.
bool ServerProtocol::refuse(Session& s, const std::string& why) {
  s.refusal = why;
  s.out += message(kRefused, {why});
  s.closing = true;
  s.in.clear();
  return false;
}

bool ServerProtocol::fail(Session& s, const std::string& why) {
  s.out += message(kFailed, {why});
  return true;
}

void ServerProtocol::answer_if_ready(Session& s) {
  for (auto& k : s.parked)
    if (!data_.count(k)) return;
  s.out += s.parked_op == kGet ? message(kOk, {data_[s.parked[0]]}) : message(kOk, {});
  s.parked.clear();
  s.parked_op = 0;
}

void ServerProtocol::wake_parked() {
  for (auto& s : sessions_)
    if (!s.dropped && s.parked_op) answer_if_ready(s);
}

}  // namespace collie::store_detail
