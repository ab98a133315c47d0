package testenv

import "testing"

// RefuseQuarantinePayloads adds a trigger that makes the database refuse every inbox row
// written 'failed' with a payload. The tests show with it that a quarantine the database
// refuses as it is still writes a minimal row. AllowQuarantinePayloads drops the trigger.
func (d Database) RefuseQuarantinePayloads(t testing.TB) {
	t.Helper()
	if !Dialect().IsPostgres() {
		d.AdminExec(t, `CREATE TRIGGER refuse_payload BEFORE INSERT ON inbox FOR EACH ROW
 IF NEW.status = 'failed' AND LENGTH(NEW.payload) > 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'payload refused'; END IF`)
		return
	}
	d.AdminExec(t, `CREATE FUNCTION refuse_payload() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'failed' AND LENGTH(NEW.payload) > 0 THEN
        RAISE EXCEPTION 'payload refused' USING ERRCODE = '45000';
    END IF;
    RETURN NEW;
END
$$`)
	d.AdminExec(t, `CREATE TRIGGER refuse_payload BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION refuse_payload()`)
}

// AllowQuarantinePayloads undoes RefuseQuarantinePayloads.
func (d Database) AllowQuarantinePayloads(t testing.TB) {
	t.Helper()
	if !Dialect().IsPostgres() {
		d.AdminExec(t, "DROP TRIGGER refuse_payload")
		return
	}
	d.AdminExec(t, "DROP TRIGGER refuse_payload ON inbox")
	d.AdminExec(t, "DROP FUNCTION refuse_payload()")
}
