from gateway.cli.main import main

main(prog_name="svc-gateway")
