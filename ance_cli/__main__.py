from ance_cli.entry import main

main()
