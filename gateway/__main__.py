from gateway.cli import main

main(prog_name="svc-gateway")
