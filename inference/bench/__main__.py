from inference.bench import main

main()
