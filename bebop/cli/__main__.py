from bebop.cli import main

main()
