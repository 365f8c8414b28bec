from cachepilot.main import main

raise SystemExit(main())
