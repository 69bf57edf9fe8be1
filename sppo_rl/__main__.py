from sppo_rl.cli import main

main()
