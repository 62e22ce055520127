-- jaxagent SQL environment: a small university department (written for jaxagent; no external data).
CREATE TABLE teachers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    department TEXT NOT NULL,
    hired_year INTEGER NOT NULL
);
CREATE TABLE courses (
    id INTEGER PRIMARY KEY,
    code TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    department TEXT NOT NULL,
    credits INTEGER NOT NULL,
    teacher_id INTEGER NOT NULL REFERENCES teachers(id)
);
CREATE TABLE students (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    year INTEGER NOT NULL,
    major TEXT NOT NULL
);
-- grade is NULL while the course is still in progress
CREATE TABLE enrollments (
    student_id INTEGER NOT NULL REFERENCES students(id),
    course_id INTEGER NOT NULL REFERENCES courses(id),
    semester TEXT NOT NULL,
    grade REAL,
    PRIMARY KEY (student_id, course_id)
);

INSERT INTO teachers VALUES
    (1, 'Dr. Amara Singh', 'Mathematics', 2012),
    (2, 'Dr. Lucas Moreau', 'Physics', 2015),
    (3, 'Dr. Sofia Rossi', 'Computer Science', 2018),
    (4, 'Dr. Kenji Mori', 'Mathematics', 2020),
    (5, 'Dr. Helen Brooks', 'History', 2010);

INSERT INTO courses VALUES
    (1, 'MATH101', 'Calculus I', 'Mathematics', 5, 1),
    (2, 'MATH201', 'Linear Algebra', 'Mathematics', 4, 4),
    (3, 'PHYS101', 'Mechanics', 'Physics', 5, 2),
    (4, 'CS101', 'Intro to Programming', 'Computer Science', 6, 3),
    (5, 'CS202', 'Databases', 'Computer Science', 4, 3),
    (6, 'HIST110', 'Modern History', 'History', 3, 5),
    (7, 'MATH310', 'Probability', 'Mathematics', 4, 1);

INSERT INTO students VALUES
    (1, 'Ana Lopez', 1, 'Computer Science'),
    (2, 'Ben Carter', 2, 'Mathematics'),
    (3, 'Chloe Dubois', 1, 'Physics'),
    (4, 'Daniel Kim', 3, 'Computer Science'),
    (5, 'Elif Yilmaz', 2, 'History'),
    (6, 'Felix Wagner', 3, 'Mathematics'),
    (7, 'Gina Russo', 1, 'Computer Science'),
    (8, 'Hugo Lambert', 2, 'Physics');

INSERT INTO enrollments VALUES
    (1, 1, '2024S', 78), (1, 4, '2024S', 91), (1, 5, '2024F', NULL),
    (2, 1, '2023F', 88), (2, 2, '2024S', 93), (2, 7, '2024F', NULL),
    (3, 1, '2024S', 65), (3, 3, '2024S', 72),
    (4, 4, '2023F', 95), (4, 5, '2024S', 89), (4, 2, '2024S', 74),
    (5, 6, '2024S', 84),
    (6, 2, '2023F', 81), (6, 7, '2024S', 90), (6, 3, '2023F', 58),
    (7, 4, '2024F', NULL),
    (8, 3, '2024S', 69), (8, 1, '2023F', 55);
