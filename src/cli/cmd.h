/* SPDX-License-Identifier: MIT */
/*
 * cmd.h -- the commands of `dlock`: one cmd_*.c each, found by name in
 * main.c's table (cli_cmds), which `dlock --help` also lists.
 *
 * A command is called with the arguments after `dlock`: argv[0] is the
 * command's name, and "--help" in argv[1] asks for its usage on stdout
 * (what `dlock help NAME` does). It returns the exit status of dlock
 * (CLI_EX_* in cli.h).
 */
#ifndef DLOCK_CLI_CMD_H
#define DLOCK_CLI_CMD_H

typedef int (*cli_cmd_fn)(int argc, char **argv);

typedef struct cli_cmd {
    const char *name;
    const char *summary; /* one line in `dlock --help` */
    cli_cmd_fn fn;
} cli_cmd;

/* The command called name, or NULL. */
const cli_cmd *cli_cmd_find(const char *name);

int cmd_run(int argc, char **argv);
/* cmd_run.c too: dlock run's machinery, under an election */
int cmd_elect(int argc, char **argv);
int cmd_leader(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_break(int argc, char **argv);
int cmd_fence(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
/* Runs the exporter program (exec): cmd_exporter.c. */
int cmd_exporter(int argc, char **argv);
int cmd_help(int argc, char **argv);

#endif
