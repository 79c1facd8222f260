// tests/fuzz/fuzz_handshake.cc: the TCP mesh's handshake
// (comm/tcp/handshake.h), on the acceptor's side and the connector's.
//
// Input: the acceptor's place (rank of n), then what arrives on one
// connection, in pieces of sizes the input picks:
//   0: any 160 bytes as the hello, then any 32 as the proof;
//   1: an honest rank's hello and its proof;
//   2: an honest hello with one byte changed in flight, then the proof the
//      honest rank computed over the hello it sent;
//   3: an honest handshake recorded, then replayed to a new connection
//      (whose acceptor draws another nonce);
// and a challenge from the input for the connector's check.
// Contract: a hello is challenged exactly when it is one of this
// communicator's (an independent check of its fields) and otherwise
// refused as a stranger; a connection is proved only by the proof of the
// secret over the very hello and nonce of this connection (never by bytes
// from the input, a hello changed in flight or a replay); the challenge's
// proof convinces the honest connector, and a challenge from the input, or
// the connector's own proof reflected back, does not (unless the input is
// the secret's proof over that hello and nonce, replayed: see below).
#include <cstring>
#include <string>

#include "comm/tcp/handshake.h"
#include "tests/fuzz/fuzz.h"

using namespace collie;
using namespace collie::tcp;
using Step = AcceptorHandshake::Step;

namespace {

const HandshakeKeys kKeys{"the job's secret", "job 17, 6 ranks"};
const std::string kComm = "collie/comm/0";

auth::Nonce nonce(uint8_t tag) {
  auth::Nonce n{};
  n.fill(tag);
  return n;
}

// The hello's fields, judged apart from the code under test.
bool of_this_comm(const Hello& h, int rank, int n) {
  size_t len = 0;
  while (len < sizeof h.key && h.key[len] != '\0') ++len;
  return h.magic == 0x434c4c48 && h.version == 3 && h.to == rank && h.from > rank && h.from < n &&
         h.lane >= 0 && h.lanes >= 1 && std::string(h.key, len) == kComm;
}

// Feeds `bytes` to the acceptor in pieces the input sizes; the step after
// the last piece (the steps before it must all be `reading`).
Step feed(AcceptorHandshake& a, const std::string& bytes, fuzz::Input& in) {
  FUZZ_CHECK(a.want() == bytes.size(), "the acceptor wants " + std::to_string(a.want()) +
                                           " bytes for a piece of " + std::to_string(bytes.size()));
  size_t at = 0;
  Step s = Step::reading;
  while (at < bytes.size()) {
    FUZZ_CHECK(s == Step::reading, "the acceptor decided before the piece was whole");
    size_t n = 1 + in.byte() % a.want();
    std::memcpy(a.into(), bytes.data() + at, n);
    at += n;
    s = a.advance(n);
  }
  return s;
}

std::string bytes_of(const void* p, size_t n) {
  return {static_cast<const char*>(p), n};
}

std::string honest_proof(const Hello& h, const AcceptorHandshake& a) {
  Challenge ch{};
  std::memcpy(&ch, a.challenge().data(), sizeof ch);
  auto m = connector_mac(kKeys, h, bytes_of(ch.nonce, sizeof ch.nonce));
  return bytes_of(m.data(), m.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int n = 2 + in.byte() % 6;
  const int rank = in.byte() % (n - 1);
  const uint8_t mode = in.byte() % 4;
  AcceptorHandshake a(kKeys, rank, n, kComm, nonce(0xa1));

  Hello sent{};
  if (mode == 0) {
    for (size_t i = 0; i < sizeof sent; ++i) reinterpret_cast<uint8_t*>(&sent)[i] = in.byte();
  } else {
    const int from = rank + 1 + in.byte() % (n - rank - 1);
    const int lanes = 1 + in.byte() % 4;
    sent = make_hello(from, rank, in.byte() % lanes, lanes, kComm, nonce(in.byte()));
    FUZZ_CHECK(of_this_comm(sent, rank, n), "make_hello made a hello this communicator refuses");
  }
  Hello arrived = sent;
  if (mode == 2)
    reinterpret_cast<uint8_t*>(&arrived)[in.byte() % sizeof arrived] ^= 1 + in.byte() % 255;

  const Step first = feed(a, bytes_of(&arrived, sizeof arrived), in);
  const bool ours = of_this_comm(arrived, rank, n);
  FUZZ_CHECK(first == (ours ? Step::challenge : Step::stranger),
             ours ? "a hello of this communicator was not challenged"
                  : "a hello that is not of this communicator was challenged");
  if (!ours) return 0;
  FUZZ_CHECK(std::memcmp(&a.hello(), &arrived, sizeof arrived) == 0, "the hello was not kept");

  // The connector's check of the challenge: the honest one convinces it
  // (for the hello it sent, unless that was changed in flight).
  Challenge ch{};
  std::memcpy(&ch, a.challenge().data(), sizeof ch);
  const bool same_hello = std::memcmp(&sent, &arrived, sizeof sent) == 0;
  FUZZ_CHECK(acceptor_proved(kKeys, sent, ch) == same_hello,
             same_hello ? "the acceptor's honest proof does not convince the connector"
                        : "a proof over a hello changed in flight convinced the connector");
  // A challenge from the input convinces the connector only if it is the
  // secret's proof over the hello it sent and the challenge's own nonce,
  // computed here apart from the code under test. (Here the nonces come
  // from the input, so the fuzzer can replay a proof it saw an acceptor
  // make for the same hello in another run, and did: real hellos and
  // challenges carry fresh random nonces, so an old proof never matches.)
  Challenge forged{};
  for (size_t i = 0; i < sizeof forged; ++i) reinterpret_cast<uint8_t*>(&forged)[i] = in.byte();
  const auth::Mac genuine =
      auth::mac(kKeys.secret, {"collie-mesh-3", "acceptor", kKeys.job, bytes_of(&sent, sizeof sent),
                               bytes_of(forged.nonce, sizeof forged.nonce)});
  FUZZ_CHECK(acceptor_proved(kKeys, sent, forged) ==
                 (std::memcmp(genuine.data(), forged.mac, sizeof forged.mac) == 0),
             "a challenge from the input convinced the connector without the secret's proof "
             "over its hello and nonce (or the proof did not)");
  Challenge reflected = ch;
  auto own = connector_mac(kKeys, sent, bytes_of(ch.nonce, sizeof ch.nonce));
  std::memcpy(reflected.mac, own.data(), own.size());
  FUZZ_CHECK(!acceptor_proved(kKeys, sent, reflected),
             "the connector's own proof, reflected, convinced it");

  std::string proof;
  if (mode == 0) {
    for (size_t i = 0; i < auth::kMacBytes; ++i) proof += static_cast<char>(in.byte());
  } else {
    proof = honest_proof(sent, a);
  }
  const bool right = proof == honest_proof(arrived, a);
  const Step second = feed(a, proof, in);
  FUZZ_CHECK(second == (right ? Step::proved : Step::unproved),
             right ? "the honest proof was refused" : "a connection was proved without the proof");
  FUZZ_CHECK(mode != 2 || same_hello || second == Step::unproved,
             "a hello changed in flight was proved");
  if (mode != 3 || second != Step::proved) return 0;

  // Replayed: the same hello and proof to a new connection, whose acceptor
  // draws its own nonce.
  AcceptorHandshake b(kKeys, rank, n, kComm, nonce(0xb2));
  FUZZ_CHECK(feed(b, bytes_of(&sent, sizeof sent), in) == Step::challenge,
             "a replayed hello of this communicator was not challenged");
  FUZZ_CHECK(feed(b, proof, in) == Step::unproved, "a replayed handshake was proved");
  return 0;
}
