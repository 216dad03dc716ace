/* test/fuzz/fuzz_targets.h — the fuzz targets for the session layer, the
 * training and flow message handlers and the file parsers.
 *
 * Each function takes one input and runs it through what the node does with
 * such bytes; a crash or sanitizer report is a finding. Every input starts
 * from fresh state (nothing carries over), so a crash replays from its input
 * alone. The libFuzzer binaries (fuzz_<name>.c) and fuzz_replay call these.
 *
 *   fuzz_frame:       byte 0 picks a mode (the rest is its input):
 *     0 wire       the bytes a peer sends after the handshake, as they come
 *                  off the socket: 24-byte stream header, then length-
 *                  prefixed records, through p2p_rx (fed in chunks whose size
 *                  the next byte picks, the big records through the window
 *                  as the session reads them) and the session's receive
 *                  steps (HELLO first, GOODBYE, payloads). The channel key
 *                  is fixed, so records that are not sealed with it stop at
 *                  "auth".
 *     1 sealed     a script of records the harness seals with that fixed key
 *                  before they go on the wire, so the fuzzer's envelopes
 *                  (protobuf, tensor headers, sizes) reach the decoder:
 *                  repeated [kind u8][len u16le][len bytes], kind & 3:
 *                  0 head, 1 head sealed FINAL, 2 payload record (no length
 *                  prefix), 3 the bytes as they are (unsealed).
 *     2 handshake  byte 1 & 3: 0 a responder reads msg1 then msg3 from the
 *                  input; 1 an initiator reads msg2 from the input (bit 2:
 *                  it expects a node ID, which the answer may not have); 2, 3
 *                  an honest initiator/responder pair whose three messages
 *                  are XORed with masks from the input: if both ends finish,
 *                  their keys must agree (else abort()).
 *   fuzz_train_msg:   a training peer (train/peer.h) behind a fake io, in a
 *                     role, stage and start state byte 0 picks, fed a script
 *                     of messages, ticks, job completions and membership
 *                     changes (fuzz_train.h has the format).
 *   fuzz_flow_msg:    a flow instance (flow/flow.h) with a fixed cast of
 *                     neighbours, fed a script of messages and ticks.
 *   fuzz_safetensors: a whole file through st_parse, then every tensor
 *                     through st_check and st_copy.
 *   fuzz_run_record:  a run record through train_run_decode; what decodes
 *                     must encode and decode to the same record.
 *   fuzz_member_token: byte 0 % 3 picks: 0 token text (gwtf1:...) through
 *                     member_token_parse and member_token_to_bin; 1 a packed
 *                     RunToken (what TRAIN_REDEEM carries) through
 *                     member_token_parse_bin; 2 the rest as an invite's
 *                     fields, signed with the fixed key and parsed back:
 *                     it must be the same invite.
 *   fuzz_member_cert: byte 0 % 4 picks: 0 a packed MemberCert, 1 a packed
 *                     RunRevocations, both verified with the fixed run key
 *                     (fuzz_member_key); 2 and 3 the same from fields, made
 *                     and parsed back. */
#ifndef GWTF_TEST_FUZZ_TARGETS_H
#define GWTF_TEST_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

int fuzz_frame(const uint8_t *data, size_t size);
int fuzz_train_msg(const uint8_t *data, size_t size);
int fuzz_flow_msg(const uint8_t *data, size_t size);
int fuzz_safetensors(const uint8_t *data, size_t size);
int fuzz_run_record(const uint8_t *data, size_t size);
int fuzz_member_token(const uint8_t *data, size_t size);
int fuzz_member_cert(const uint8_t *data, size_t size);
/* The fixed run key the member targets verify with (seed 0x42 x 32). */
struct member_key;
void fuzz_member_key(struct member_key *k);

/* For the corpus generator and the frame target: the fixed channel. */
#define FUZZ_FRAME_MAX (64u << 10) /* the receiver's max_frame: small, so the limits are reached */
void fuzz_frame_key(uint8_t key[32]);
/* The node ID of the peer the frames come from (the envelope's sender). */
void fuzz_frame_peer(uint8_t id[32]);

/* For the corpus generators: writes buf to ROOT/SUB/<first 16 hex digits of
 * its hash> (exits on failure). */
void fuzz_corpus_write(const char *root, const char *sub, const uint8_t *buf, size_t len);

#endif
