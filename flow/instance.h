/* flow/instance.h — a flow problem: stages, nodes with capacities, directed
 * links with costs. The input of the reference solvers, of the greedy
 * baseline and of the simulated protocol runs (`gwtf sim flow`).
 *
 * Topology is a stage ring: stage 0 holds the data nodes (each one is the
 * source and the sink of its own flows), stages 1..S hold relays. Links go
 * stage s -> s+1 for s = 0..S-1 and stage S -> stage 0. A flow of data node
 * d is a path d -> stage 1 -> ... -> stage S -> d over existing links; a
 * relay carries at most `capacity` flows; a data node wants `capacity`
 * flows of its own.
 *
 * JSON (the format; "cost" on a node is an optional extension, the
 * node's own processing cost added to every flow through it, default 0):
 *
 *   { "stages": S,
 *     "nodes": [ {"id": 0, "stage": 0, "capacity": 40}, ... ],
 *     "links": [ {"from": 0, "to": 1, "cost": 7.0}, ... ] }
 *
 * Node ids are any distinct integers in [0, 2^31); arrays keep file order.
 * flow_instance_load names the first problem it finds ("links[3]: node 17 is
 * in stage 2 but node 4 is in stage 5; links go from stage s to s+1"). */
#ifndef GWTF_FLOW_INSTANCE_H
#define GWTF_FLOW_INSTANCE_H

#include <stddef.h>
#include <stdint.h>

/* Limits on what a file may ask for, checked before anything is allocated. */
#define FLOW_INST_MAX_STAGES (1024)
#define FLOW_INST_MAX_NODES (100000)
#define FLOW_INST_MAX_LINKS (4000000)
#define FLOW_INST_MAX_CAPACITY (1000000)
#define FLOW_INST_MAX_COST (1e12)

typedef struct flow_inst_node {
  int id;       /* as in the file */
  int stage;    /* 0 = data node */
  int capacity; /* relay: flows it can carry; data node: flows it wants */
  double cost;  /* processing cost per flow through the node (extension; 0 by default) */
} flow_inst_node;

typedef struct flow_inst_link {
  int from, to; /* node indices (not ids) */
  double cost;
} flow_inst_link;

typedef struct flow_instance {
  int stages; /* S: relay stages 1..S */
  int n_nodes;
  flow_inst_node *nodes;
  int n_links;
  flow_inst_link *links;
} flow_instance;

/* An error message buffer that loaders fill; FLOW_ERR_LEN is plenty. */
#define FLOW_ERR_LEN (256)

/* Writes a message into err (when err_len > 0) and returns code: the one
 * way the flow layer's checkers and loaders report what they found. */
int flow_error(char *err, size_t err_len, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

void flow_instance_free(flow_instance *in);

/* Parses and validates a JSON instance. Returns 0, or GW_EINVAL / GW_EIO /
 * GW_ENOMEM with err describing the problem. */
int flow_instance_load(const char *path, flow_instance *out, char *err, size_t err_len);
int flow_instance_parse(const char *json, size_t len, flow_instance *out, char *err, size_t err_len);
/* Checks an instance built in memory (the loaders call it too). */
int flow_instance_validate(const flow_instance *in, char *err, size_t err_len);
/* Serialises to JSON (the same format; keys in a fixed order). The caller
 * frees the string. NULL on allocation failure. */
char *flow_instance_to_json(const flow_instance *in);

/* Index of the node with this id, or -1. Linear; for setup code. */
int flow_instance_find(const flow_instance *in, int id);
/* Number of data nodes (stage 0). */
int flow_instance_sources(const flow_instance *in);

/* Table V of the paper (flow test settings), setting 1..6:
 *
 *   K  sources relays stages capacities   link costs
 *   1     1      40     8     U(1,3)       U(1,20)
 *   2     1      40    10     U(1,3)       U(1,20)
 *   3     1      40     8     U(5,15)      U(1,20)
 *   4     1      40     8     U(1,3)       U(5,100)
 *   5     2      40     8     U(1,3)       U(1,20)
 *   6     4      80     8     U(1,3)       U(1,20)
 *
 * with every ⌊U(a,b)⌋ read literally: an integer drawn uniformly from
 * [a, b-1]. Relays are spread evenly over the stages (40/8 = 5 per stage;
 * with 10 stages, 4). Links are complete between consecutive stages, each
 * with its own cost draw, in both ring directions at stage 0. "The
 * source-sinks were given sufficient capacity to prevent bottlenecks": each
 * data node wants as many flows as the largest stage can carry. Returns 0 or
 * GW_EINVAL (unknown setting) / GW_ENOMEM. */
int flow_instance_table5(int setting, uint64_t seed, flow_instance *out);

#endif
