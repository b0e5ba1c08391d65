from loopaudit.commands.cli import main

main()
