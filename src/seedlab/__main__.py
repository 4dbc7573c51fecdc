from seedlab.cli import main

main()
