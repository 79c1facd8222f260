// comm/store/store_protocol.h: the TCP store's wire records, and the
// server's side of the protocol apart from its sockets.
//
// comm/store/tcp_store.cc moves the bytes (one poll() thread for every
// connection); what the server makes of the bytes a connection sends (the
// handshake, the requests, the replies, the requests parked until their keys
// exist) lives here, so that it can be run on any bytes without a socket
// (tests/fuzz/fuzz_store.cc). The wire format is described at the top of
// tcp_store.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "collie/store.h"
#include "comm/net/auth.h"

namespace collie::store_detail {

enum Request : uint8_t {
  kHello = 1,
  kSet,
  kGet,
  kAdd,
  kWait,
  kCompareSet,
  kDelete,
  kCheck,
  kProof
};
enum Status : uint8_t { kOk = 0, kFailed = 1, kRefused = 2 };

// The magic names the protocol version too: a client of another version is
// dropped at the handshake instead of misreading replies.
constexpr std::string_view kMagic = "collie-store-2";
constexpr size_t kMaxKey = 4096;
constexpr size_t kMaxValue = size_t{64} << 20;
// compare_set carries two values; a wait may carry many keys.
constexpr size_t kMaxRecord = 2 * kMaxValue + (size_t{64} << 10);
// Before the handshake is done a connection may make the server buffer no more.
constexpr size_t kMaxHello = 1024;

void put_u32(std::string& s, uint32_t v);
uint32_t get_u32(const char* c);

// A whole message: length, then a record of `head` and the fields.
std::string message(uint8_t head, const std::vector<std::string_view>& fields);
// Splits the fields of a record after its head byte; false when malformed.
bool parse_fields(std::string_view rec, std::vector<std::string>& out);

// The two MACs of a handshake: distinct labels, so that neither side's
// proof can be reflected back as the other's.
auth::Mac server_mac(const std::string& secret, std::string_view job, std::string_view client_nonce,
                     std::string_view server_nonce);
auth::Mac client_mac(const std::string& secret, std::string_view job, std::string_view client_nonce,
                     std::string_view server_nonce);
inline std::string_view mac_view(const auth::Mac& m) {
  return {reinterpret_cast<const char*>(m.data()), m.size()};
}

// Up to 8 keys, for messages.
std::string list_keys(const std::vector<std::string>& keys);

// What the server knows of one connection.
struct Session {
  std::string in;   // bytes received, not yet a whole record
  std::string out;  // replies not yet sent, from out_at on
  size_t out_at = 0;
  bool authed = false;
  std::string client_nonce;  // from the hello; empty until then
  auth::Nonce server_nonce{};
  bool closing = false;             // refused: close once `out` is sent
  bool dropped = false;             // close now, without a word
  std::string refusal;              // why it was refused, for the server's log
  uint8_t parked_op = 0;            // a get or wait waiting for keys
  std::vector<std::string> parked;  // the keys it waits for
  bool has_output() const { return out_at < out.size(); }
};

// The server's state: the keys and values, and every open connection's
// session. Sessions are made by open() and live until close(); a request
// on one may answer requests parked on any other.
class ServerProtocol {
 public:
  explicit ServerProtocol(StoreAuth auth, std::function<auth::Nonce()> nonce = auth::fresh_nonce)
      : auth_(std::move(auth)), nonce_(std::move(nonce)) {}

  Session* open();
  void close(Session* s);

  // Takes `bytes` received on `s` and handles every whole record buffered.
  // False when `s` reads no more: dropped (a malformed record, a length
  // over the cap, a second request while one is parked, anything but a
  // collie hello before the handshake) or refused (closing, with the reply
  // that says why queued and `refusal` set).
  bool receive(Session& s, std::string_view bytes);

  const std::map<std::string, std::string>& data() const { return data_; }
  const StoreAuth& auth() const { return auth_; }

 private:
  bool handle(Session& s, std::string& rec);
  bool handshake(Session& s, uint8_t op, const std::vector<std::string>& f);
  bool refuse(Session& s, const std::string& why);
  bool fail(Session& s, const std::string& why);
  bool drop(Session& s);
  void answer_if_ready(Session& s);
  void wake_parked();

  const StoreAuth auth_;
  std::function<auth::Nonce()> nonce_;
  std::map<std::string, std::string> data_;
  std::list<Session> sessions_;
};

}  // namespace collie::store_detail
