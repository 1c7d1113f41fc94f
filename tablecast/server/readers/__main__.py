from tablecast.server.readers.process import main

main()
