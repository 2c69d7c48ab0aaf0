// The device agent (docs/protocol.md §3.1, §9): hello, the server epoch, tasks one at a time on
// a worker thread, blob serving on its own thread, heartbeats, and the result re-offer.
#pragma once

namespace fedsdk {
// `fedsdk-device run --broker URL --fleet F --device-id D --data DIR --work-dir DIR
//  [--ca-file PEM] [--heartbeat S] [--announce-window S]`; returns the exit code.
int run_client(int argc, char** argv);
}  // namespace fedsdk
