from swarmget.cli import main

raise SystemExit(main())
