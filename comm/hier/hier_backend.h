// comm/hier/hier_backend.h: collie's backend for ranks on several hosts.
//
// It is built of the others' runners. The ranks first tell each other their
// host (topology::host_identity), then:
//
//  * one host: everything runs on shm, as the shm backend would;
//  * one rank per host, or hosts with different rank counts: everything runs
//    on a tcp mesh of all ranks, as the tcp backend would;
//  * H hosts of L ranks each: an all-reduce is a reduce-scatter inside each
//    host over shm (local rank i ends with slice i of its host's sum), an
//    all-reduce of slice i across hosts over tcp, among the H ranks that
//    hold slice i, and an all-gather inside each host over shm. Each host
//    sends 2 (H-1)/H of the message over the network, against 2 (N-1)/N for
//    a flat ring of the N = H L ranks (1 against 1.5 for 2 hosts of 2), over
//    L connections at once. On crowded hosts small all-reduces take two
//    stages instead (hier_choose.h): an all-reduce inside each host, then
//    one across hosts of each host's sum; larger ones go in one piece.
//    Every other operation runs on the tcp mesh of all ranks.
//
// The all-reduce runs in pieces (COLLIE_HIER_PIECE), the cross-host stage of
// one on a second thread beside the shm stages of the next and the previous.
// Every runner shares the communicator's failure latch and the operation's
// deadline; an error of a stage names the stage and the ranks it ran on.
#pragma once

#include "comm/backend.h"

namespace collie::hier {

// The registry's line for this backend.
BackendEntry backend_entry();

}  // namespace collie::hier
