/* node/main.c — `gwtf`: one binary for every peer and every tool. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "gwtf_version.h" /* GWTF_GIT_COMMIT, generated at build time (node/CMakeLists.txt) */
#include "node/cmd.h"
#include "p2p/identity.h"

#ifndef GWTF_VERSION
#define GWTF_VERSION "0.0.0"
#endif

/* One line per command; two-word names ("bench dht") group related tools. */
static const gwtf_cmd commands[] = {
    {"keygen", "create an identity key file and print its node ID", cmd_keygen, cmd_keygen_help},
    {"data synth", "write a synthetic fallback corpus", cmd_data_synth, cmd_data_synth_help},
    {"data info", "validate a dataset file and describe it", cmd_data_info, cmd_data_info_help},
    {"swarm", "run a local training swarm with churn, log streams merged", cmd_swarm, cmd_swarm_help},
    {"experiment", "run a scenario with gwtf or SWARM routing and report the paper's metrics", cmd_experiment,
     cmd_experiment_help},
    {"train-ref", "train a run in one process (the reference a swarm must match)", cmd_train_ref, cmd_train_ref_help},
    {"export", "write a run's model as a Hugging Face-style directory (safetensors + config.json)", cmd_export,
     cmd_export_help},
    {"sample", "generate text from an exported model with a KV cache", cmd_sample, cmd_sample_help},
    {"sim flow", "route an instance's flows: gwtf protocol (simulated), optimal or greedy", cmd_sim_flow, cmd_sim_flow_help},
    {"sim gen", "write the flow instance of the paper's Table V setting K", cmd_sim_gen, cmd_sim_gen_help},
    {"check stage", "run PyTorch reference fixtures on a backend", cmd_check_stage, cmd_check_stage_help},
    {"bench stage", "time a stage's forward and backward", cmd_bench_stage, cmd_bench_stage_help},
    {"node", "run a peer: listen, connect to bootstrap peers, keep sessions", cmd_node, cmd_node_help},
    {"invite", "print an invite token to a private run (on its creator)", cmd_invite, cmd_invite_help},
    {"revoke", "revoke a member of a private run (on its creator)", cmd_revoke, cmd_revoke_help},
    {"bench agg", "time the aggregator's mean and trimmed mean", cmd_bench_agg, cmd_bench_agg_help},
    {"bench wire", "time each wire format's encode and decode, bytes and error", cmd_bench_wire,
     cmd_bench_wire_help},
    {"bench p2p", "handshake time and framed session throughput on loopback", cmd_bench_p2p, cmd_bench_p2p_help},
    {"sim join", "compare where joining nodes go (paper Table IV / Fig. 5)", cmd_sim_join, cmd_sim_join_help},
    {"lookup", "print the members of a stage (or the run records) found in the DHT", cmd_lookup, cmd_lookup_help},
    {"bench dht", "measure DHT lookups and record fetches with N nodes on loopback", cmd_bench_dht,
     cmd_bench_dht_help},
};

static const size_t n_commands = sizeof(commands) / sizeof(commands[0]);

/* Commands may be one word ("node") or two ("bench dht"); the longest match
 * wins. *words is set to how many argv entries the name used. */
static const gwtf_cmd *find_command(int argc, char **argv, int *words) {
  char two[128];
  if (argc >= 2) {
    snprintf(two, sizeof(two), "%s %s", argv[0], argv[1]);
    for (size_t i = 0; i < n_commands; i++)
      if (strcmp(commands[i].name, two) == 0) return (*words = 2), &commands[i];
  }
  for (size_t i = 0; i < n_commands; i++)
    if (strcmp(commands[i].name, argv[0]) == 0) return (*words = 1), &commands[i];
  return NULL;
}

/* "gwtf bench" alone: list the commands that start with that word. */
static int list_group(const char *word, FILE *fp) {
  size_t n = strlen(word);
  int found = 0;
  for (size_t i = 0; i < n_commands; i++) {
    if (strncmp(commands[i].name, word, n) == 0 && commands[i].name[n] == ' ') {
      if (!found) fprintf(fp, "usage: gwtf %s <what> [options]\n\n", word);
      fprintf(fp, "  gwtf %-14s %s\n", commands[i].name, commands[i].summary);
      found = 1;
    }
  }
  return found;
}

static void usage(FILE *fp) {
  fprintf(fp,
          "gwtf " GWTF_VERSION " — train one language model together over a peer-to-peer swarm\n\n"
          "usage: gwtf <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < n_commands; i++) fprintf(fp, "  %-14s %s\n", commands[i].name, commands[i].summary);
  fprintf(fp, "  %-14s %s\n", "help", "show help for a command: gwtf help <command>");
  fprintf(fp, "\noptions:\n  --version  print the version and exit\n  --help     this text\n");
}

static int help(int argc, char **argv) {
  if (argc < 2) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--list") == 0) { /* for tools: packaging/gen_man.sh builds the man page */
    for (size_t i = 0; i < n_commands; i++) printf("%s\n", commands[i].name);
    return 0;
  }
  int words = 0;
  const gwtf_cmd *cmd = find_command(argc - 1, argv + 1, &words);
  if (!cmd) {
    if (list_group(argv[1], stdout)) return 0;
    fprintf(stderr, "gwtf: no command '%s' (see gwtf help)\n", argv[1]);
    return 2;
  }
  cmd->help();
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    printf("gwtf %s (commit %s)\n", GWTF_VERSION, GWTF_GIT_COMMIT);
    return 0;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "help") == 0) return help(argc - 1, argv + 1);
  int words = 0;
  const gwtf_cmd *cmd = find_command(argc - 1, argv + 1, &words);
  if (!cmd) {
    if (list_group(argv[1], stderr)) return 2;
    fprintf(stderr, "gwtf: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
  }
  if (p2p_crypto_init() != 0) {
    fprintf(stderr, "gwtf: libsodium failed to initialise\n");
    return 1;
  }
  optind = 1; /* each command parses its own options from argv[0] = its (last) name */
  return cmd->run(argc - words, argv + words);
}
