/* `gwtf data synth|info`: make a fallback corpus, or check a dataset file. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "node/cmd.h"
#include "train/data.h"
#include "util/err.h"

void cmd_data_synth_help(void) {
  printf("usage: gwtf data synth --out FILE [--bytes N] [--seed S]\n\n"
         "Writes N bytes (default 1000000) of synthetic English-like text from a small\n"
         "seeded grammar: the fallback corpus when the default dataset cannot be fetched.\n");
}

int cmd_data_synth(int argc, char **argv) {
  static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                       {"bytes", required_argument, 0, 'b'},
                                       {"seed", required_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
  const char *out = NULL;
  long long bytes = 1000000;
  unsigned long long seed = 1;
  int c;
  while ((c = getopt_long(argc, argv, "o:b:s:h", opts, NULL)) != -1) {
    switch (c) {
    case 'o': out = optarg; break;
    case 'b': bytes = atoll(optarg); break;
    case 's': seed = strtoull(optarg, NULL, 10); break;
    case 'h': cmd_data_synth_help(); return 0;
    default: cmd_data_synth_help(); return 2;
    }
  }
  if (!out || bytes < 1024 || bytes > (1LL << 32)) {
    fprintf(stderr, "gwtf data synth: --out FILE is required and --bytes must be in [1024, 4 GiB]\n");
    return 2;
  }
  int rc = train_synth_corpus(out, (size_t)bytes, seed);
  if (rc != 0) {
    fprintf(stderr, "gwtf data synth: cannot write %s: %s\n", out, gw_strerror(rc));
    return 1;
  }
  fprintf(stderr, "gwtf data synth: wrote %lld bytes to %s\n", bytes, out);
  return 0;
}

void cmd_data_info_help(void) {
  printf("usage: gwtf data info FILE\n\n"
         "Validates a dataset (UTF-8 text, or an llm.c uint16 token file) and prints\n"
         "its kind, size, token count and the vocabulary size it needs.\n");
}

int cmd_data_info(int argc, char **argv) {
  if (argc != 2 || argv[1][0] == '-') {
    cmd_data_info_help();
    return 2;
  }
  train_dataset ds;
  char err[512], desc[256];
  if (train_dataset_open(argv[1], &ds, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf data info: %s\n", err);
    return 1;
  }
  train_dataset_describe(&ds, desc, sizeof(desc));
  printf("%s: %s\n", argv[1], desc);
  train_dataset_close(&ds);
  return 0;
}
