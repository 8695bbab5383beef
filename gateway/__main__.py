from gateway.app.cli import main

raise SystemExit(main())
