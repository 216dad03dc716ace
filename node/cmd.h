/* node/cmd.h — the `gwtf` subcommands.
 *
 * Each subcommand lives in its own node/cmd_*.c and is listed once in the
 * table in node/main.c. A command gets argv with argv[0] = its own name, so
 * getopt_long works as in a standalone program; it returns the process exit
 * code (0 ok, 1 failure, 2 usage or "nothing found" where documented).
 * Two-word commands ("bench dht", "sim flow") get argv[0] = the second word. */
#ifndef GWTF_NODE_CMD_H
#define GWTF_NODE_CMD_H

typedef struct gwtf_cmd {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
  void (*help)(void);
} gwtf_cmd;

int cmd_keygen(int argc, char **argv);
void cmd_keygen_help(void);
int cmd_data_synth(int argc, char **argv);
void cmd_data_synth_help(void);
int cmd_data_info(int argc, char **argv);
void cmd_data_info_help(void);
int cmd_train_ref(int argc, char **argv);
void cmd_train_ref_help(void);
int cmd_swarm(int argc, char **argv);
void cmd_swarm_help(void);
int cmd_experiment(int argc, char **argv);
void cmd_experiment_help(void);
int cmd_sim_flow(int argc, char **argv);
void cmd_sim_flow_help(void);
int cmd_sim_gen(int argc, char **argv);
void cmd_sim_gen_help(void);
int cmd_check_stage(int argc, char **argv);
void cmd_check_stage_help(void);
int cmd_bench_stage(int argc, char **argv);
void cmd_bench_stage_help(void);
int cmd_node(int argc, char **argv);
void cmd_node_help(void);
int cmd_bench_agg(int argc, char **argv);
void cmd_bench_agg_help(void);
int cmd_bench_wire(int argc, char **argv);
void cmd_bench_wire_help(void);
int cmd_bench_p2p(int argc, char **argv);
void cmd_bench_p2p_help(void);
int cmd_sim_join(int argc, char **argv);
void cmd_sim_join_help(void);
int cmd_lookup(int argc, char **argv);
void cmd_lookup_help(void);
int cmd_invite(int argc, char **argv);
void cmd_invite_help(void);
int cmd_revoke(int argc, char **argv);
void cmd_revoke_help(void);
int cmd_bench_dht(int argc, char **argv);
void cmd_bench_dht_help(void);
int cmd_export(int argc, char **argv);
void cmd_export_help(void);
int cmd_sample(int argc, char **argv);
void cmd_sample_help(void);

#endif
