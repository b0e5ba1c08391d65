from loopaudit.cli import main

main()
