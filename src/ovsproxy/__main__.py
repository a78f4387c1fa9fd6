from ovsproxy.cli import main

main()
