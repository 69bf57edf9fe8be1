from sppo_rl.cli import entry

entry()
