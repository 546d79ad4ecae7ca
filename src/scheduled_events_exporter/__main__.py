from scheduled_events_exporter.cli import main

raise SystemExit(main())
