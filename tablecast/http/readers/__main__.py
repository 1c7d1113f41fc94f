from tablecast.http.readers.process import main

main()
