from ance_cli.main import main

main()
