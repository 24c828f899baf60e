"""Host side: command line, training driver, board/simulation transports."""
