from kiro.cli import main

main()
