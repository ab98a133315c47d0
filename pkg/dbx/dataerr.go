package dbx

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// MySQL and MariaDB error numbers of values the server refuses (IsDataError).
const (
	erBadNullError              = 1048 // column cannot be null
	erDupUnique                 = 1169 // can't write, because of unique constraint
	erNoReferencedRow           = 1216 // a foreign key's parent row is missing (older servers)
	erRowIsReferenced           = 1217 // a row other rows reference (older servers)
	erWarnDataOutOfRange        = 1264 // out of range value for a column
	warnDataTruncated           = 1265 // data truncated for a column
	erTruncatedWrongValue       = 1292 // incorrect or truncated value (a datetime, a number)
	erInvalidCharacterString    = 1300 // invalid character string in the connection's charset
	erDivisionByZero            = 1365 // division by 0 in strict mode
	erTruncatedWrongValueField  = 1366 // incorrect string or number value for a column
	erIllegalValueForType       = 1367 // illegal value found during parsing
	erDataTooLong               = 1406 // data too long for a column
	erWrongValueForType         = 1411 // incorrect value for a function
	erRowIsReferenced2          = 1451 // a row other rows reference
	erNoReferencedRow2          = 1452 // a foreign key's parent row is missing
	erForeignDuplicateKey       = 1557 // an update would duplicate a key through a foreign key
	erDupEntryWithKeyName       = 1586 // duplicate entry, with the key's name
	erDataOutOfRange            = 1690 // a value out of range in an expression
	erForeignDupKeyWithChild    = 1761 // a foreign key's update would duplicate a child's key
	erForeignDupKeyWithoutChild = 1762 // the same, without the child's name
	erDupUnknownInIndex         = 1859 // duplicate entry for a key
	erInvalidJSONText           = 3140 // invalid JSON text (MySQL 8's JSON type)
	erCheckConstraintViolated   = 3819 // a CHECK constraint is violated (MySQL 8)
	erConstraintFailed          = 4025 // a CHECK constraint failed (MariaDB)
)

// IsDataError reports an error the server raised because of the values a statement carries:
// a value it cannot store (an invalid byte sequence, a string too long, a number out of
// range, a bad datetime, a NULL in a NOT NULL column) or one that violates a constraint (a
// unique key, a foreign key, a CHECK). The same values fail the same way on every attempt,
// so no retry helps. On PostgreSQL it is every SQLSTATE of class 22 (data exception) and 23
// (integrity constraint violation); on MySQL and MariaDB the error numbers of the same
// meaning, which they raise in strict mode.
//
// A unique-key violation is one (IsDuplicate), whoever's key it is: a caller whose own
// statements may race on a key of theirs tells that key apart by its name (DuplicateKey).
func IsDataError(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case erBadNullError, ErDupEntry, erDupUnique, erNoReferencedRow, erRowIsReferenced, erWarnDataOutOfRange,
			warnDataTruncated, erTruncatedWrongValue, erInvalidCharacterString, erDivisionByZero, erTruncatedWrongValueField,
			erIllegalValueForType, erDataTooLong, erWrongValueForType, erRowIsReferenced2, erNoReferencedRow2,
			erForeignDuplicateKey, erDupEntryWithKeyName, erDataOutOfRange, erForeignDupKeyWithChild,
			erForeignDupKeyWithoutChild, erDupUnknownInIndex, erInvalidJSONText, erCheckConstraintViolated, erConstraintFailed:
			return true
		}
		return false
	}
	code := pgCode(err)
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23")
}

// DuplicateKey returns the name of the unique key (PostgreSQL: the constraint) a unique-key
// violation names, without a table in front of it (MySQL 8 says 'inbox.uk_dedup'). It
// returns "" for another error, or when the server names no key.
func DuplicateKey(err error) string {
	if !IsDuplicate(err) {
		return ""
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		// "Duplicate entry '<value>' for key '<name>'": the value may hold quotes, the name
		// ends the message.
		const mark = " for key '"
		i := strings.LastIndex(me.Message, mark)
		if i < 0 || !strings.HasSuffix(me.Message, "'") {
			return ""
		}
		name := me.Message[i+len(mark) : len(me.Message)-1]
		if j := strings.LastIndexByte(name, '.'); j >= 0 {
			name = name[j+1:]
		}
		return name
	}
	return pgConstraint(err)
}
